//! Mesh layouts as CuTe-style (size, stride) modes over the world index.
//!
//! The world is a 1-D range of `W` indices; `rank_map[i]` is the rank placed at index `i`
//! (identity when absent). A mesh dimension ([`Axis`]) is a short list of modes in lexicographic
//! order (outermost first). Element `x` of an axis with modes `(s0,d0),(s1,d1)` sits at world
//! offset `x0*d0 + x1*d1` where `(x0, x1)` is `x` in mixed radix `(s0, s1)`.
//!
//! Worked example: a world of 8 ranks unflattened into `(dp=2, tp=4)` has modes
//! `dp = 2:4`, `tp = 4:1`. Rank 6 sits at index 6 = 1*4 + 2*1, so its coordinate is (1, 2),
//! its `tp` group is `6 - 2*1 + {0,1,2,3} = [4,5,6,7]` and its `dp` group is
//! `6 - 1*4 + {0,4} = [2,6]`. Flattening `(dp, tp)` again coalesces `(2,4):(4,1)` into `8:1`.
//!
//! The copies of a layout across the world are enumerated with torch's complement: the gaps
//! between the layout's modes, outermost (largest stride) first, so copies come in increasing
//! order of their base offset — exactly `torch.distributed._mesh_layout._MeshLayout.remap_to_tensor`.
//!
//! Every layout built here from a world by unflatten / slice / flatten has modes that, together
//! with their complement, form a mixed-radix system of `[0, W)`. That is what makes the
//! per-rank queries O(group size): the digit of index `i` in mode `(s, d)` is `(i / d) % s`.

use std::sync::{Arc, OnceLock};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{LayoutError, Result, Value, MAX_WORLD_SIZE};
use crate::slice::Slice;

/// One (size, stride) mode over the world index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mode {
    pub size: u64,
    pub stride: u64,
}

impl Mode {
    pub const fn new(size: u64, stride: u64) -> Self {
        Mode { size, stride }
    }
}

/// One mesh dimension: coalesced modes in lexicographic order. No modes means size 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Axis {
    modes: Vec<Mode>,
}

impl Axis {
    /// Builds an axis, coalescing as torch's `_FlatLayout` does (drops size-1 modes, merges a
    /// mode into its inner neighbour when `inner.size * inner.stride == outer.stride`).
    pub fn from_modes(modes: &[Mode]) -> Self {
        Axis {
            modes: coalesce(modes),
        }
    }

    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    pub fn numel(&self) -> u64 {
        self.modes.iter().map(|m| m.size).product()
    }

    /// The part of world index `i` this axis accounts for: `sum(digit * stride)`.
    fn offset_part(&self, i: u64) -> u64 {
        self.modes
            .iter()
            .map(|m| (i / m.stride) % m.size * m.stride)
            .sum()
    }

    /// Lexicographic coordinate of world index `i` along this axis.
    fn coordinate(&self, i: u64) -> u64 {
        self.modes
            .iter()
            .fold(0, |c, m| c * m.size + (i / m.stride) % m.size)
    }
}

/// torch's lexicographic `coalesce`, on a flat list of modes.
pub(crate) fn coalesce(modes: &[Mode]) -> Vec<Mode> {
    let mut out: Vec<Mode> = Vec::with_capacity(modes.len());
    for m in modes.iter().rev() {
        if m.size == 1 {
            continue;
        }
        if let Some(inner) = out.last_mut() {
            if inner.size * inner.stride == m.stride {
                inner.size *= m.size;
                continue;
            }
        }
        out.push(*m);
    }
    out.reverse();
    out
}

/// `modes` sorted by stride, largest first, with adjacent ones merged: the canonical form of the
/// set of offsets they reach, whatever their order (what partitions are compared by).
fn by_stride_coalesced(mut modes: Vec<Mode>) -> Vec<Mode> {
    modes.sort_by_key(|m| std::cmp::Reverse(m.stride));
    coalesce(&modes)
}

/// `axis ∘ (n : d)` for a compact right-hand layout: skip `d` elements of the axis (innermost
/// first), then keep `n`. `None` when the sizes do not split the axis's modes evenly, which is
/// exactly when torch's pycute composition raises.
fn compose(axis: &[Mode], n: u64, d: u64) -> Option<Vec<Mode>> {
    let inner_first: Vec<Mode> = axis.iter().rev().copied().collect();
    let mut idx = 0;
    let mut cur = inner_first.first().copied();
    let mut rest = d;
    while rest > 1 {
        let m = cur?;
        if rest % m.size == 0 {
            rest /= m.size;
            idx += 1;
            cur = inner_first.get(idx).copied();
        } else if m.size % rest == 0 {
            cur = Some(Mode::new(m.size / rest, m.stride * rest));
            rest = 1;
        } else {
            return None;
        }
    }
    let mut need = n;
    let mut out = Vec::new();
    while need > 1 {
        let m = cur?;
        if need % m.size == 0 {
            out.push(m);
            need /= m.size;
            idx += 1;
            cur = inner_first.get(idx).copied();
        } else if m.size % need == 0 {
            out.push(Mode::new(need, m.stride));
            need = 1;
        } else {
            return None;
        }
    }
    out.reverse();
    Some(coalesce(&out))
}

/// torch's lexicographic `complement` of `modes` within `[0, world)`: the gap modes, outermost first.
fn complement(modes: &[Mode], world: u64) -> Vec<Mode> {
    let mut sorted: Vec<Mode> = modes.iter().filter(|m| m.size > 1).copied().collect();
    sorted.sort_by_key(|m| (m.stride, m.size));
    let mut out = Vec::with_capacity(sorted.len() + 1);
    let mut cur = 1u64;
    for m in sorted {
        out.push(Mode::new(m.stride / cur, cur));
        cur = m.size * m.stride;
    }
    out.push(Mode::new(world.div_ceil(cur), cur));
    out.reverse();
    coalesce(&out)
}

/// Calls `f` with every offset of `modes` in lexicographic order (last mode fastest).
fn for_each_offset(modes: &[Mode], mut f: impl FnMut(u64)) {
    let n = modes.len();
    if n == 0 {
        f(0);
        return;
    }
    let inner = modes[n - 1];
    let mut digits = vec![0u64; n - 1];
    let mut base = 0u64;
    loop {
        for k in 0..inner.size {
            f(base + k * inner.stride);
        }
        // odometer over the outer modes
        let mut j = n - 1;
        loop {
            if j == 0 {
                return;
            }
            j -= 1;
            digits[j] += 1;
            base += modes[j].stride;
            if digits[j] < modes[j].size {
                break;
            }
            base -= modes[j].size * modes[j].stride;
            digits[j] = 0;
        }
    }
}

fn offsets(modes: &[Mode]) -> Vec<u64> {
    let mut v = Vec::with_capacity(modes.iter().map(|m| m.size as usize).product());
    for_each_offset(modes, |o| v.push(o));
    v
}

/// The world a family of layouts is derived from: its size and rank map (with its inverse,
/// computed once per family and shared by every layout derived from it).
#[derive(Debug)]
pub struct World {
    size: u64,
    rank_map: Option<Box<[i32]>>,
    inverse: Option<Box<[i32]>>,
    placement: Option<Placement>,
    renumbering: Option<Renumbering>,
    digest: OnceLock<u64>,
}

/// A world re-formed after ranks left the job (a failure), stored in O(changes): index `i` held
/// old rank `i` of a job of `old_global` ranks, or the old rank of the spare that took its place;
/// the ranks still alive were then renumbered in order (what torch's `shrink_group` and an
/// ordered re-rendezvous do): new rank = old rank - (ranks removed below it). Example: a job of
/// 9 (8 in the mesh, spare 8) loses rank 3 and spare 8 takes index 3: index 3 is new rank 7, and
/// indices 4..8 are new ranks 3..7.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renumbering {
    pub old_global: u64,
    /// Old ranks that left the job, sorted.
    pub removed: Vec<u64>,
    /// `(index, old rank)`: the spares, sorted by index.
    pub replaced: Vec<(u64, u64)>,
    /// The same pairs as `(old rank, index)`, sorted by rank.
    by_rank: Vec<(u64, u64)>,
}

impl Renumbering {
    #[inline]
    fn new_rank(&self, old: u64) -> u64 {
        old - self.removed.partition_point(|&r| r < old) as u64
    }

    #[inline]
    fn rank_at(&self, index: u64) -> u64 {
        let old = match self.replaced.binary_search_by_key(&index, |&(i, _)| i) {
            Ok(k) => self.replaced[k].1,
            Err(_) => index,
        };
        self.new_rank(old)
    }

    /// The index of new rank `rank`, or None when it holds no index (an unused rank).
    fn index_of(&self, rank: u64, size: u64) -> Option<u64> {
        // the old rank: the `rank`-th old rank not removed (removed is sorted)
        let mut old = rank;
        for &r in &self.removed {
            if r <= old {
                old += 1;
            } else {
                break;
            }
        }
        if let Ok(k) = self.by_rank.binary_search_by_key(&old, |&(r, _)| r) {
            return Some(self.by_rank[k].1);
        }
        let replaced = self
            .replaced
            .binary_search_by_key(&old, |&(i, _)| i)
            .is_ok();
        (old < size && !replaced).then_some(old)
    }

    /// `removed [..], spares {index: old rank}` as errors and reprs show it.
    pub fn describe(&self) -> String {
        let spares: Vec<String> = self
            .replaced
            .iter()
            .map(|(i, r)| format!("{i}: {r}"))
            .collect();
        format!(
            "job of {} renumbered without {:?}, spares {{{}}}",
            self.old_global,
            self.removed,
            spares.join(", ")
        )
    }
}

/// Where a world over part of the job sits: index `i` of the world is rank `slice.rank_at(i)`
/// (`offset + sum(digit_k(i) * stride_k)`, see [`Slice`]) of a job of `global` ranks. O(modes)
/// to store, whatever the number of ranks: a contiguous range `[S, S + N)` is `offset S, modes
/// [(N, 1)]`, a strided one `offset S, modes [(N, k)]`, the ranks of a `(dp, tp)` mesh inferred
/// from its groups the modes of its dims side by side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub global: u64,
    pub slice: Slice,
}

impl Placement {
    pub fn offset(&self) -> u64 {
        self.slice.offset()
    }

    /// In lexicographic order over the world index (outermost first), size-1 modes dropped.
    pub fn modes(&self) -> &[Mode] {
        self.slice.modes()
    }

    /// `offset + (sizes):(strides)`, as errors and reprs show a placement.
    pub fn describe(&self) -> String {
        self.slice.describe()
    }
}

impl World {
    /// Validates the world size and the rank map (a permutation of `range(size)`).
    /// An identity rank map is stored as none, so it compares and hashes as the default.
    pub fn new(size: i128, rank_map: Option<&[i64]>) -> Result<World> {
        let size = check_world_size(size)?;
        let (rank_map, inverse) = match rank_map {
            None => (None, None),
            Some(map) => validate_rank_map(size, map)?,
        };
        Ok(World {
            size,
            rank_map,
            inverse,
            placement: None,
            renumbering: None,
            digest: OnceLock::new(),
        })
    }

    /// A world over part of a job of `global` ranks: its index `i` is rank `offset + sum(digit_k(i) *
    /// stride_k)` (see [`Placement`]). The modes must be positive and must not overlap (sorted by
    /// stride, each stride at least the span of the modes inside it, so each rank appears once),
    /// and every rank must be below `global`. A placement of every rank in order is the plain
    /// world of `global` ranks.
    pub fn placed(global: i128, offset: i128, modes: &[(i128, i128)]) -> Result<World> {
        let global = check_world_size(global)?;
        let limit = format!("within the world of {global} ranks");
        let slice = Slice::bounded(offset, modes, global, &limit)?;
        if offset == 0 && slice.len() == global && slice.modes().len() <= 1 {
            return World::new(global as i128, None);
        }
        Ok(World {
            size: slice.len(),
            rank_map: None,
            inverse: None,
            placement: Some(Placement { global, slice }),
            renumbering: None,
            digest: OnceLock::new(),
        })
    }

    /// The world of `size` indices re-formed after a failure (see [`Renumbering`]): before it,
    /// index `i` was rank `i` of a job of `old_global` ranks (`size` of them in the mesh, the
    /// rest spares); the old ranks `removed` left the job, the spare with old rank `r` takes index
    /// `i` for each `(i, r)` in `replaced`, and the ranks still alive are renumbered in order.
    /// Stored in O(removed + replaced). Every rank of the new job must hold an index (unused
    /// spares leave the new world), every index a rank that is alive. No change is the plain world.
    pub fn renumbered(
        old_global: i128,
        size: i128,
        removed: &[i128],
        replaced: &[(i128, i128)],
    ) -> Result<World> {
        let old_global = check_world_size(old_global)?;
        let bad = |field: String, value: Value, detail: String| LayoutError::InvalidLayout {
            field,
            value,
            detail,
        };
        if size <= 0 || size > old_global as i128 {
            return Err(bad(
                "size".into(),
                Value::Int(size),
                format!("the mesh holds 1 to {old_global} ranks of the old job of {old_global}"),
            ));
        }
        let size = size as u64;
        let mut gone: Vec<u64> = Vec::with_capacity(removed.len());
        for (k, &r) in removed.iter().enumerate() {
            if r < 0 || r >= old_global as i128 {
                return Err(bad(
                    format!("removed[{k}]"),
                    Value::Int(r),
                    format!("rank {r} is not a rank of the old job of {old_global} ranks (0..{old_global})"),
                ));
            }
            gone.push(r as u64);
        }
        gone.sort_unstable();
        if let Some(w) = gone.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(
                "removed".into(),
                Value::Int(w[0] as i128),
                format!("rank {} is listed twice", w[0]),
            ));
        }
        let mut pairs: Vec<(u64, u64)> = Vec::with_capacity(replaced.len());
        for (k, &(i, r)) in replaced.iter().enumerate() {
            if i < 0 || i >= size as i128 {
                return Err(bad(
                    format!("replaced[{k}]"),
                    Value::Ints(vec![i, r]),
                    format!("index {i} is not an index of the mesh of {size} ranks"),
                ));
            }
            if r < 0 || r >= old_global as i128 {
                return Err(bad(
                    format!("replaced[{k}]"),
                    Value::Ints(vec![i, r]),
                    format!("spare rank {r} is not a rank of the old job of {old_global} ranks"),
                ));
            }
            if gone.binary_search(&(r as u64)).is_ok() {
                return Err(bad(
                    format!("replaced[{k}]"),
                    Value::Ints(vec![i, r]),
                    format!(
                        "spare rank {r} is one of the removed ranks; give a spare that is alive"
                    ),
                ));
            }
            pairs.push((i as u64, r as u64));
        }
        pairs.sort_unstable();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(bad(
                "replaced".into(),
                Value::Int(w[0].0 as i128),
                format!("index {} is given two spares", w[0].0),
            ));
        }
        let mut by_rank: Vec<(u64, u64)> = pairs.iter().map(|&(i, r)| (r, i)).collect();
        by_rank.sort_unstable();
        if let Some(w) = by_rank.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(bad(
                "replaced".into(),
                Value::Int(w[0].0 as i128),
                format!("spare rank {} takes two indices", w[0].0),
            ));
        }
        let taken = |i: u64| pairs.binary_search_by_key(&i, |&(j, _)| j).is_ok();
        // a spare from inside the mesh leaves its own index, which another spare must fill
        if let Some(&(r, i)) = by_rank.iter().find(|&&(r, _)| r < size && !taken(r)) {
            return Err(bad(
                "replaced".into(),
                Value::Ints(vec![i as i128, r as i128]),
                format!(
                    "rank {r} moves to index {i} but also keeps its own index {r}; give index {r} a spare too"
                ),
            ));
        }
        // every index whose rank left must have a spare
        if let Some(&r) = gone.iter().find(|&&r| r < size && !taken(r)) {
            return Err(bad(
                "removed".into(),
                Value::Int(r as i128),
                format!(
                    "rank {r} left the job but index {r} of the mesh has no spare; give it one \
                     (replaced {{{r}: spare}}) or shrink the mesh"
                ),
            ));
        }
        let new_global = old_global - gone.len() as u64;
        if new_global != size {
            return Err(bad(
                "removed".into(),
                Value::Int(gone.len() as i128),
                format!(
                    "the new job has {new_global} ranks but the mesh {size}: every rank of the new job must \
                     hold an index, so remove the spares left unused ({} of them) from the new job too",
                    new_global - size
                ),
            ));
        }
        if gone.is_empty() && pairs.iter().all(|&(i, r)| i == r) {
            return World::new(size as i128, None);
        }
        Ok(World {
            size,
            rank_map: None,
            inverse: None,
            placement: None,
            renumbering: Some(Renumbering {
                old_global,
                removed: gone,
                replaced: pairs,
                by_rank,
            }),
            digest: OnceLock::new(),
        })
    }

    /// How this world was re-formed after a failure, or None.
    pub fn renumbering(&self) -> Option<&Renumbering> {
        self.renumbering.as_ref()
    }

    /// Where this world sits in a larger job, or None for a world of the whole job.
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// Ranks in the job this world's ranks belong to (its own size unless placed).
    pub fn global_size(&self) -> u64 {
        self.placement.as_ref().map_or(self.size, |p| p.global)
    }

    /// Whether `rank` is one of this world's ranks.
    pub fn is_member(&self, rank: i128) -> bool {
        self.index_of(rank).is_ok()
    }

    /// The rank at every index, in index order (O(size)), or None for the identity.
    pub fn ranks(&self) -> Option<Vec<i32>> {
        if self.is_identity() {
            return None;
        }
        Some((0..self.size).map(|i| self.rank_at(i)).collect())
    }

    /// Whether index `i` is rank `i` for every index (no rank map, no placement).
    pub fn is_identity(&self) -> bool {
        self.rank_map.is_none() && self.placement.is_none() && self.renumbering.is_none()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The rank map, or `None` for the identity.
    pub fn rank_map(&self) -> Option<&[i32]> {
        self.rank_map.as_deref()
    }

    #[inline]
    pub fn rank_at(&self, index: u64) -> i32 {
        match (&self.rank_map, &self.placement, &self.renumbering) {
            (Some(m), _, _) => m[index as usize],
            (None, Some(p), _) => p.slice.rank_at(index) as i32,
            (None, None, Some(n)) => n.rank_at(index) as i32,
            (None, None, None) => index as i32,
        }
    }

    fn index_of(&self, rank: i128) -> Result<u64> {
        let global = self.global_size();
        if rank < 0 || rank >= global as i128 {
            return Err(LayoutError::RankOutOfRange {
                rank,
                world_size: global,
            });
        }
        if let Some(p) = &self.placement {
            return p
                .slice
                .index_of(rank as u64)
                .ok_or_else(|| LayoutError::NotAMember {
                    rank,
                    ranks: p.describe(),
                });
        }
        if let Some(n) = &self.renumbering {
            return n
                .index_of(rank as u64, self.size)
                .ok_or_else(|| LayoutError::NotAMember {
                    rank,
                    ranks: n.describe(),
                });
        }
        Ok(match &self.inverse {
            None => rank as u64,
            Some(inv) => inv[rank as usize] as u64,
        })
    }

    /// Stable digest of (size, rank map); 64-bit xxh3 over a little-endian encoding.
    fn digest(&self) -> u64 {
        *self.digest.get_or_init(|| {
            let mut h = Xxh3::new();
            h.update(b"rankmesh.world.v1");
            h.update(&self.size.to_le_bytes());
            if let Some(p) = &self.placement {
                h.update(b"placed");
                h.update(&p.global.to_le_bytes());
                h.update(&p.offset().to_le_bytes());
                for m in p.modes() {
                    h.update(&m.size.to_le_bytes());
                    h.update(&m.stride.to_le_bytes());
                }
            }
            if let Some(n) = &self.renumbering {
                h.update(b"renumbered");
                h.update(&n.old_global.to_le_bytes());
                for r in &n.removed {
                    h.update(&r.to_le_bytes());
                }
                h.update(b"spares");
                for (i, r) in &n.replaced {
                    h.update(&i.to_le_bytes());
                    h.update(&r.to_le_bytes());
                }
            }
            match &self.rank_map {
                None => h.update(&[0]),
                Some(map) => {
                    h.update(&[1]);
                    let mut buf = Vec::with_capacity(4096 * 4);
                    for chunk in map.chunks(4096) {
                        buf.clear();
                        for r in chunk {
                            buf.extend_from_slice(&r.to_le_bytes());
                        }
                        h.update(&buf);
                    }
                }
            }
            h.digest()
        })
    }

    fn same(&self, other: &World) -> bool {
        std::ptr::eq(self, other)
            || (self.size == other.size
                && self.rank_map == other.rank_map
                && self.placement == other.placement
                && self.renumbering == other.renumbering)
    }
}

/// Validates a world size: positive, and at most [`MAX_WORLD_SIZE`] (ranks are int32).
pub fn check_world_size(size: i128) -> Result<u64> {
    if size <= 0 {
        return Err(LayoutError::InvalidSize {
            field: "world_size".into(),
            value: size,
        });
    }
    if size > MAX_WORLD_SIZE as i128 {
        return Err(LayoutError::Overflow {
            field: "world_size".into(),
            value: Value::Int(size),
            detail: format!(
                "ranks must fit int32, so a world holds at most {MAX_WORLD_SIZE} ranks"
            ),
        });
    }
    Ok(size as u64)
}

type RankMaps = (Option<Box<[i32]>>, Option<Box<[i32]>>);

fn validate_rank_map(size: u64, map: &[i64]) -> Result<RankMaps> {
    let bad = |value: i128, detail: String| LayoutError::InvalidRankMap {
        world_size: size,
        value: Value::Int(value),
        detail,
    };
    if map.len() as u64 != size {
        return Err(bad(
            map.len() as i128,
            format!("it has {} entries, expected world_size = {size}", map.len()),
        ));
    }
    let mut inverse = vec![-1i32; size as usize];
    let mut identity = true;
    for (i, &r) in map.iter().enumerate() {
        if r < 0 || r >= size as i64 {
            return Err(bad(
                r.into(),
                format!("rank_map[{i}] = {r} is outside 0..{size}"),
            ));
        }
        let first = inverse[r as usize];
        if first >= 0 {
            let mut seen = vec![false; size as usize];
            map.iter()
                .filter(|&&x| x >= 0 && x < size as i64)
                .for_each(|&x| seen[x as usize] = true);
            let missing = seen.iter().position(|&s| !s).unwrap_or(0);
            return Err(bad(
                r.into(),
                format!(
                    "rank {r} appears at indices {first} and {i}, and rank {missing} is missing"
                ),
            ));
        }
        inverse[r as usize] = i as i32;
        identity &= r == i as i64;
    }
    if identity {
        return Ok((None, None));
    }
    let forward: Box<[i32]> = map.iter().map(|&r| r as i32).collect();
    Ok((Some(forward), Some(inverse.into_boxed_slice())))
}

/// A mesh layout: named axes over one world. Cheap to clone (the world and the root's names are
/// shared).
///
/// Like a torch `DeviceMesh`, a layout has a *root*: the layout it was derived from by unflatten,
/// slicing and flatten, which keep their parent's root. [`Layout::world`] and [`Layout::from_parts`]
/// (raw modes, `MeshLayout.with_modes`) start a root of their own. A flatten may not take a name
/// the root uses (torch: "already exists for submesh of the root mesh"), so the root's names travel
/// with every layout derived from it; they take no part in equality, hashing or the fingerprint.
#[derive(Clone, Debug)]
pub struct Layout {
    world: Arc<World>,
    axes: Vec<Axis>,
    names: Vec<String>,
    root_names: Arc<[String]>,
}

impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        self.axes == other.axes && self.names == other.names && self.world.same(&other.world)
    }
}
impl Eq for Layout {}

impl Layout {
    /// The 1-D mesh of the whole world, named `"world"`.
    pub fn world(world_size: i128, rank_map: Option<&[i64]>) -> Result<Layout> {
        let world = Arc::new(World::new(world_size, rank_map)?);
        Ok(Self::from_world(world))
    }

    /// The 1-D mesh named `"world"` over part of a job of `global` ranks (see [`World::placed`]).
    pub fn placed(global: i128, offset: i128, modes: &[(i128, i128)]) -> Result<Layout> {
        Ok(Self::from_world(Arc::new(World::placed(
            global, offset, modes,
        )?)))
    }

    /// The 1-D `"world"` mesh of a world re-formed after a failure ([`World::renumbered`]).
    pub fn renumbered(
        old_global: i128,
        size: i128,
        removed: &[i128],
        replaced: &[(i128, i128)],
    ) -> Result<Layout> {
        Ok(Self::from_world(Arc::new(World::renumbered(
            old_global, size, removed, replaced,
        )?)))
    }

    /// The 1-D `"world"` mesh of an existing (shared) world.
    pub fn from_world(world: Arc<World>) -> Layout {
        let axis = Axis::from_modes(&[Mode::new(world.size, 1)]);
        let names = vec!["world".to_string()];
        Layout {
            world,
            axes: vec![axis],
            root_names: names.clone().into(),
            names,
        }
    }

    /// Rebuilds a layout from raw `(size, stride)` integers per dim, as Python hands them over (e.g.
    /// when unpickling): each mode must be positive (else `InvalidLayout` on field `axes[a][k]`)
    /// and fit 64 bits (else `Overflow` on the culprit, `axes[a][k][0]` for the size or
    /// `axes[a][k][1]` for the stride); then [`Layout::from_parts`] validates the rest.
    pub fn from_raw_parts(
        world: Arc<World>,
        axes: &[Vec<(i128, i128)>],
        names: &[String],
    ) -> Result<Layout> {
        let mut modes = Vec::with_capacity(axes.len());
        for (a, raw) in axes.iter().enumerate() {
            let mut dim = Vec::with_capacity(raw.len());
            for (k, &(size, stride)) in raw.iter().enumerate() {
                let field = format!("axes[{a}][{k}]");
                if size <= 0 || stride <= 0 {
                    let detail = format!(
                        "mode ({size}, {stride}) needs a positive size and stride; a mode is (size, stride) over the \
                         world index, like torch's _MeshLayout shape and stride"
                    );
                    return Err(LayoutError::InvalidLayout {
                        field,
                        value: Value::Ints(vec![size, stride]),
                        detail,
                    });
                }
                let (Ok(s), Ok(d)) = (u64::try_from(size), u64::try_from(stride)) else {
                    let (part, culprit, v) = if u64::try_from(size).is_err() {
                        (0, "size", size)
                    } else {
                        (1, "stride", stride)
                    };
                    let detail = format!(
                        "the {culprit} of mode ({size}, {stride}) does not fit 64 bits; no mode of a world of at most \
                         {MAX_WORLD_SIZE} ranks is that large"
                    );
                    return Err(LayoutError::Overflow {
                        field: format!("{field}[{part}]"),
                        value: Value::Int(v),
                        detail,
                    });
                };
                dim.push(Mode::new(s, d));
            }
            modes.push(dim);
        }
        Self::from_parts(world, &modes, names)
    }

    /// Rebuilds a layout from raw modes (e.g. when unpickling), validating everything.
    pub fn from_parts(world: Arc<World>, axes: &[Vec<Mode>], names: &[String]) -> Result<Layout> {
        if axes.len() != names.len() {
            return Err(LayoutError::SizeMismatch {
                field: "names".into(),
                value: Value::Names(names.to_vec()),
                detail: format!(
                    "{} axes but {} names; give one name per dim",
                    axes.len(),
                    names.len()
                ),
            });
        }
        check_names(names, "names")?;
        for (a, modes) in axes.iter().enumerate() {
            for (k, m) in modes.iter().enumerate() {
                if m.size == 0 || m.stride == 0 {
                    return Err(LayoutError::InvalidLayout {
                        field: format!("axes[{a}][{k}]"),
                        value: Value::Ints(vec![m.size.into(), m.stride.into()]),
                        detail: format!(
                            "mode {}:{} needs a positive size and stride",
                            m.size, m.stride
                        ),
                    });
                }
            }
        }
        check_tiling(axes, world.size)?;
        let axes = axes.iter().map(|m| Axis::from_modes(m)).collect();
        Ok(Layout {
            world,
            axes,
            names: names.to_vec(),
            root_names: names.into(),
        })
    }

    /// This layout as derived from a root named `root_names` (what unpickling restores): a
    /// flatten then refuses those names. They must be non-empty and unique (else `InvalidName` /
    /// `DuplicateName` on field `root_names`).
    pub fn with_root_names(mut self, root_names: &[String]) -> Result<Layout> {
        check_names(root_names, "root_names")?;
        self.root_names = root_names.into();
        Ok(self)
    }

    /// The names of this layout's root (see [`Layout`]): `["world"]` for everything derived from
    /// [`Layout::world`].
    pub fn root_names(&self) -> &[String] {
        &self.root_names
    }

    pub fn world_arc(&self) -> &Arc<World> {
        &self.world
    }

    /// Ranks in the job (the default process group): the world's own size unless placed.
    pub fn global_size(&self) -> u64 {
        self.world.global_size()
    }

    /// Whether `rank` of the job is one of this layout's world's ranks (always, unless placed).
    pub fn is_member(&self, rank: i128) -> bool {
        self.world.is_member(rank)
    }

    /// The 1-D `"world"` mesh of the world this layout is over (the same shared world: O(1), and
    /// equal to the layout the world was built as).
    pub fn world_layout(&self) -> Layout {
        Layout::from_world(self.world.clone())
    }

    pub fn world_size(&self) -> u64 {
        self.world.size
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    pub fn ndim(&self) -> usize {
        self.axes.len()
    }

    pub fn shape(&self) -> Vec<u64> {
        self.axes.iter().map(Axis::numel).collect()
    }

    /// Number of ranks in one copy of this mesh.
    pub fn numel(&self) -> u64 {
        self.axes.iter().map(Axis::numel).product()
    }

    /// Number of copies of this mesh that tile the world.
    pub fn num_copies(&self) -> u64 {
        self.world.size / self.numel()
    }

    /// Resolves a dimension index (negative counts from the end, as in Python).
    pub fn dim_index(&self, dim: i128) -> Result<usize> {
        let n = self.axes.len() as i128;
        let d = if dim < 0 { dim + n } else { dim };
        if d < 0 || d >= n {
            return Err(LayoutError::DimOutOfRange {
                dim,
                ndim: self.axes.len(),
                names: self.names.clone(),
            });
        }
        Ok(d as usize)
    }

    /// Resolves a dimension name.
    pub fn dim_by_name(&self, name: &str) -> Result<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| LayoutError::UnknownName {
                name: name.into(),
                available: self.names.clone(),
            })
    }

    /// Splits dimension `dim` into `sizes` named `names`, like `DeviceMesh._unflatten`.
    pub fn unflatten(&self, dim: usize, sizes: &[i128], names: &[String]) -> Result<Layout> {
        let axis = self
            .axes
            .get(dim)
            .ok_or_else(|| LayoutError::DimOutOfRange {
                dim: dim as i128,
                ndim: self.axes.len(),
                names: self.names.clone(),
            })?;
        if sizes.is_empty() {
            return Err(LayoutError::SizeMismatch {
                field: "sizes".into(),
                value: Value::Ints(Vec::new()),
                detail: "sizes is empty; give at least one size, e.g. (dim_size,)".into(),
            });
        }
        if sizes.len() != names.len() {
            return Err(LayoutError::SizeMismatch {
                field: "names".into(),
                value: Value::Names(names.to_vec()),
                detail: format!(
                    "got {} sizes but {} names; give one name per size",
                    sizes.len(),
                    names.len()
                ),
            });
        }
        let mut usizes = Vec::with_capacity(sizes.len());
        let mut product: u64 = 1;
        for (i, &s) in sizes.iter().enumerate() {
            if s <= 0 {
                return Err(LayoutError::InvalidSize {
                    field: format!("sizes[{i}]"),
                    value: s,
                });
            }
            if s > MAX_WORLD_SIZE as i128 {
                return Err(LayoutError::Overflow {
                    field: format!("sizes[{i}]"),
                    value: Value::Int(s),
                    detail: format!("a mesh dimension holds at most {MAX_WORLD_SIZE} ranks"),
                });
            }
            product = product.checked_mul(s as u64).ok_or_else(|| LayoutError::Overflow {
                field: format!("sizes[{i}]"),
                value: Value::Int(s),
                detail: format!(
                    "the product of sizes[0..={i}] {:?} does not fit 64 bits, while the sizes must multiply \
                     to exactly {}, the size of dim {:?}",
                    &sizes[..=i],
                    axis.numel(),
                    self.names[dim]
                ),
            })?;
            usizes.push(s as u64);
        }
        if product != axis.numel() {
            return Err(LayoutError::SizeMismatch {
                field: "sizes".into(),
                value: Value::Ints(sizes.to_vec()),
                detail: format!(
                    "the product of sizes {sizes:?} is {product}, but dim {:?} has size {}; \
                     the sizes must multiply to exactly {}",
                    self.names[dim],
                    axis.numel(),
                    axis.numel()
                ),
            });
        }
        let mut new_names = self.names.clone();
        new_names.splice(dim..=dim, names.iter().cloned());
        check_names(&new_names, "names")?;

        let mut new_axes = Vec::with_capacity(sizes.len());
        let mut inner = product;
        for &n in &usizes {
            inner /= n;
            let modes = compose(axis.modes(), n, inner).ok_or_else(|| LayoutError::Incompatible {
                field: "sizes".into(),
                sizes: sizes.to_vec(),
                detail: format!(
                    "sizes {sizes:?} cannot unflatten dim {:?}: its ranks form the non-uniform \
                     strides {} (it was flattened from non-adjacent dims) and size {n} does not split \
                     them evenly; pick sizes whose factors follow its modes",
                    self.names[dim],
                    describe_modes(axis.modes())
                ),
            })?;
            new_axes.push(Axis { modes });
        }
        let mut axes = self.axes.clone();
        axes.splice(dim..=dim, new_axes);
        Ok(Layout {
            world: self.world.clone(),
            axes,
            names: new_names,
            root_names: self.root_names.clone(),
        })
    }

    /// Selects dimensions by name, like `DeviceMesh.__getitem__` (names in mesh order).
    pub fn slice<S: AsRef<str>>(&self, names: &[S]) -> Result<Layout> {
        if names.is_empty() {
            return Err(LayoutError::EmptySlice {
                available: self.names.clone(),
            });
        }
        let mut idx = Vec::with_capacity(names.len());
        for n in names {
            idx.push(self.dim_by_name(n.as_ref())?);
        }
        let owned: Vec<String> = names.iter().map(|n| n.as_ref().to_string()).collect();
        check_names(&owned, "names")?;
        if idx.windows(2).any(|w| w[0] > w[1]) {
            let mut fix = idx.clone();
            fix.sort_unstable();
            return Err(LayoutError::SliceOrder {
                names: owned,
                mesh_order: self.names.clone(),
                fix: fix.iter().map(|&i| self.names[i].clone()).collect(),
            });
        }
        Ok(Layout {
            world: self.world.clone(),
            axes: idx.iter().map(|&i| self.axes[i].clone()).collect(),
            names: owned,
            root_names: self.root_names.clone(),
        })
    }

    /// A 1-D layout over all dims of this one (adjacent or not), like `DeviceMesh._flatten`.
    /// `name` defaults to the dim names joined by `_`, as in torch. As in torch, a 1-D layout
    /// flattened into its own name is itself, and any other name the root uses is refused
    /// (`RootNameTaken`): `world(8).unflatten(0, [2, 4], ["dp", "tp"]).slice(["dp"])` cannot be
    /// flattened as `"world"`. O(ndim + root ndim).
    pub fn flatten(&self, name: Option<&str>) -> Result<Layout> {
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| self.names.join("_"));
        check_names(std::slice::from_ref(&name), "name")?;
        if self.names.len() == 1 && self.names[0] == name {
            return Ok(self.clone());
        }
        if self.root_names.contains(&name) {
            return Err(LayoutError::RootNameTaken {
                field: "name".into(),
                name,
                root: self.root_names.to_vec(),
            });
        }
        let all: Vec<Mode> = self
            .axes
            .iter()
            .flat_map(|a| a.modes().iter().copied())
            .collect();
        Ok(Layout {
            world: self.world.clone(),
            axes: vec![Axis::from_modes(&all)],
            names: vec![name],
            root_names: self.root_names.clone(),
        })
    }

    fn all_modes(&self) -> Vec<Mode> {
        self.axes
            .iter()
            .flat_map(|a| a.modes().iter().copied())
            .collect()
    }

    /// Canonical modes of one dim's partition of the world: equal keys (over one world) mean
    /// equal sets of groups, whatever the order of ranks inside a group. A group is the set of
    /// translates of `{sum(x_k * stride_k)}`, which does not depend on the order of the modes,
    /// so the key is the modes sorted by stride with adjacent ones merged. E.g. `dp x tp` of 8
    /// ranks flattened as `(tp, dp)` has modes `(4:1),(2:4)`; its key is `[(8:1)]`, the world.
    pub fn partition_key(&self, dim: usize) -> Result<Vec<Mode>> {
        Ok(by_stride_coalesced(
            self.axes[self.dim_index(dim as i128)?].modes().to_vec(),
        ))
    }

    /// The ranks of `rank`'s group along `dim` (who `get_group(dim)` connects), in mesh order.
    /// O(group size).
    pub fn group(&self, rank: i128, dim: usize) -> Result<Vec<i32>> {
        let i = self.world.index_of(rank)?;
        let axis = &self.axes[self.dim_index(dim as i128)?];
        let base = i - axis.offset_part(i);
        let mut out = Vec::with_capacity(axis.numel() as usize);
        for_each_offset(axis.modes(), |o| out.push(self.world.rank_at(base + o)));
        Ok(out)
    }

    /// The ranks of `rank`'s group along `dim` as a set, in O(modes): a [`Slice`] from the
    /// group's smallest rank over the dim's partition modes (increasing order), or None when
    /// the world is not in rank order (a rank map, a placement or a re-form: read
    /// [`Layout::group`]).
    pub fn group_slice(&self, rank: i128, dim: usize) -> Result<Option<Slice>> {
        let i = self.world.index_of(rank)?;
        let axis = &self.axes[self.dim_index(dim as i128)?];
        if !self.world.is_identity() {
            return Ok(None);
        }
        let key = by_stride_coalesced(axis.modes().to_vec());
        Slice::from_modes(i - axis.offset_part(i), &key, self.world.size).map(Some)
    }

    /// The local mesh a DeviceMesh of this layout holds on `rank` (row-major, `shape()`).
    /// O(mesh size).
    pub fn mesh_of(&self, rank: i128) -> Result<Vec<i32>> {
        let i = self.world.index_of(rank)?;
        let base = i - self.axes.iter().map(|a| a.offset_part(i)).sum::<u64>();
        let mut out = Vec::with_capacity(self.numel() as usize);
        for_each_offset(&self.all_modes(), |o| {
            out.push(self.world.rank_at(base + o))
        });
        Ok(out)
    }

    /// `rank`'s coordinate in this mesh, as `DeviceMesh.get_coordinate()`.
    pub fn coordinate_of(&self, rank: i128) -> Result<Vec<u64>> {
        let i = self.world.index_of(rank)?;
        Ok(self.axes.iter().map(|a| a.coordinate(i)).collect())
    }

    /// Which copy of the mesh (row of `groups()`) holds `rank`.
    pub fn copy_index_of(&self, rank: i128) -> Result<u64> {
        let i = self.world.index_of(rank)?;
        let comp = complement(&self.all_modes(), self.world.size);
        Ok(comp
            .iter()
            .fold(0, |c, m| c * m.size + (i / m.stride) % m.size))
    }

    /// Every copy of the mesh across the world, shape `(num_copies, *shape)` flattened
    /// row-major, in torch's order. O(W).
    pub fn groups(&self) -> Vec<i32> {
        let modes = self.all_modes();
        let inner = offsets(&modes);
        let comp = complement(&modes, self.world.size);
        let mut out = Vec::with_capacity(self.world.size as usize);
        let world = &self.world;
        for_each_offset(&comp, |base| {
            out.extend(inner.iter().map(|&o| world.rank_at(base + o)));
        });
        out
    }

    /// Whether the two layouts split the job into the same groups (each copy of the mesh one
    /// group, as a set of ranks, whatever the order inside it): O(modes) when they are over the
    /// same world and their modes, sorted by stride, agree; otherwise O(world), comparing each
    /// rank's smallest group-mate.
    pub fn same_groups(&self, other: &Layout) -> bool {
        if self.global_size() != other.global_size() || self.world.size != other.world.size {
            return false;
        }
        let key = |l: &Layout| by_stride_coalesced(l.all_modes());
        if self.world.same(&other.world) && key(self) == key(other) {
            return true;
        }
        self.numel() == other.numel() && self.group_labels() == other.group_labels()
    }

    /// For every rank of the job, the smallest rank of its group (-1 outside the world).
    fn group_labels(&self) -> Vec<i64> {
        let mut labels = vec![-1i64; self.global_size() as usize];
        let groups = self.groups();
        for group in groups.chunks(self.numel().max(1) as usize) {
            let least = group.iter().copied().min().unwrap_or(0) as i64;
            for &r in group {
                labels[r as usize] = least;
            }
        }
        labels
    }

    /// A stable 64-bit fingerprint of (world size, rank map, dims with their modes, names):
    /// equal on every rank, every run and every platform.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(b"rankmesh.layout.v1");
        h.update(&self.world.digest().to_le_bytes());
        h.update(&(self.axes.len() as u64).to_le_bytes());
        for (axis, name) in self.axes.iter().zip(&self.names) {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&(axis.modes.len() as u64).to_le_bytes());
            for m in &axis.modes {
                h.update(&m.size.to_le_bytes());
                h.update(&m.stride.to_le_bytes());
            }
        }
        h.digest()
    }
}

pub(crate) fn describe_modes(modes: &[Mode]) -> String {
    let s: Vec<String> = modes.iter().map(|m| m.size.to_string()).collect();
    let d: Vec<String> = modes.iter().map(|m| m.stride.to_string()).collect();
    format!("({}):({})", s.join(","), d.join(","))
}

fn check_names(names: &[String], field: &str) -> Result<()> {
    for (i, n) in names.iter().enumerate() {
        if n.is_empty() {
            return Err(LayoutError::InvalidName {
                field: field.into(),
                name: n.clone(),
                detail: "names must be non-empty strings".into(),
            });
        }
        if names[..i].contains(n) {
            return Err(LayoutError::DuplicateName {
                field: field.into(),
                name: n.clone(),
            });
        }
    }
    Ok(())
}

/// Checks that the modes of `axes` are non-overlapping and, with their complement, tile
/// `[0, world)`. A mode that alone spans more than the world is blamed by its field
/// `axes[a][k]`; a fault between modes by the field `axes`, with every dim's modes as the value.
fn check_tiling(axes: &[Vec<Mode>], world: u64) -> Result<()> {
    for (a, modes) in axes.iter().enumerate() {
        for (k, m) in modes.iter().enumerate() {
            let span = u128::from(m.size) * u128::from(m.stride);
            if m.size > 1 && span > u128::from(world) {
                return Err(LayoutError::InvalidLayout {
                    field: format!("axes[{a}][{k}]"),
                    value: Value::Ints(vec![m.size.into(), m.stride.into()]),
                    detail: format!(
                        "mode {}:{} spans {span} world indices, more than a world of {world} ranks holds",
                        m.size, m.stride
                    ),
                });
            }
        }
    }
    let all: Vec<Mode> = axes.iter().flatten().copied().collect();
    let between = |detail: String| LayoutError::InvalidLayout {
        field: "axes".into(),
        value: Value::Modes(
            axes.iter()
                .map(|a| a.iter().map(|m| (m.size, m.stride)).collect())
                .collect(),
        ),
        detail,
    };
    let mut sorted: Vec<Mode> = all.iter().filter(|m| m.size > 1).copied().collect();
    sorted.sort_by_key(|m| (m.stride, m.size));
    let mut cur = 1u64;
    for m in &sorted {
        if m.stride % cur != 0 {
            return Err(between(format!(
                "modes {} overlap or leave an uneven gap",
                describe_modes(&all)
            )));
        }
        cur = m.size * m.stride; // <= world, checked above
    }
    if world % cur != 0 {
        return Err(between(format!(
            "modes {} do not tile a world of {world} ranks",
            describe_modes(&all)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn two_by_four_doc_example() {
        let w = Layout::world(8, None).unwrap();
        let m = w.unflatten(0, &[2, 4], &names(&["dp", "tp"])).unwrap();
        assert_eq!(m.shape(), vec![2, 4]);
        assert_eq!(m.group(6, 1).unwrap(), vec![4, 5, 6, 7]);
        assert_eq!(m.group(6, 0).unwrap(), vec![2, 6]);
        assert_eq!(m.coordinate_of(6).unwrap(), vec![1, 2]);
        assert_eq!(
            m.slice(&["dp"]).unwrap().groups(),
            vec![0, 4, 1, 5, 2, 6, 3, 7]
        );
        assert_eq!(
            m.flatten(None).unwrap().axes()[0].modes(),
            &[Mode::new(8, 1)]
        );
    }

    #[test]
    fn world_layout_is_the_world_a_layout_derives_from() {
        let w = Layout::world(8, Some(&[3, 1, 2, 0, 7, 5, 6, 4])).unwrap();
        let tp = w.unflatten(0, &[2, 4], &names(&["dp", "tp"])).unwrap();
        let tp = tp.slice(&["tp"]).unwrap();
        assert!(tp.world_layout() == w);
        assert_eq!(tp.world_layout().names(), &["world".to_string()]);
        let other = Layout::world(8, Some(&[0, 1, 2, 3, 7, 5, 6, 4])).unwrap();
        assert!(tp.world_layout() != other);
    }

    #[test]
    fn torch_remap_examples() {
        // torch _mesh_layout docstring: world 4 as 2x2, layout 2:2 -> [[0,2],[1,3]]
        let w = Layout::world(4, None)
            .unwrap()
            .unflatten(0, &[2, 2], &names(&["a", "b"]))
            .unwrap();
        assert_eq!(w.slice(&["a"]).unwrap().groups(), vec![0, 2, 1, 3]);
        // with rank map [10,20,30,40] shifted to a permutation: [1,2,3,0]
        let w = Layout::world(4, Some(&[1, 2, 3, 0])).unwrap();
        let m = w.unflatten(0, &[2, 2], &names(&["a", "b"])).unwrap();
        assert_eq!(m.slice(&["a"]).unwrap().groups(), vec![1, 3, 2, 0]);
        assert_eq!(m.group(0, 0).unwrap(), vec![2, 0]);
    }

    #[test]
    fn non_adjacent_flatten_and_unflatten() {
        let w = Layout::world(8, None).unwrap();
        let m = w
            .unflatten(0, &[2, 2, 2], &names(&["a", "b", "c"]))
            .unwrap();
        let ac = m.slice(&["a", "c"]).unwrap().flatten(Some("ac")).unwrap();
        assert_eq!(ac.groups(), vec![0, 1, 4, 5, 2, 3, 6, 7]);
        let xy = ac.unflatten(0, &[2, 2], &names(&["x", "y"])).unwrap();
        assert_eq!(xy.slice(&["x"]).unwrap().group(5, 0).unwrap(), vec![1, 5]);
        // (2,3):(9,1) cannot be split as (3,2)
        let w = Layout::world(18, None).unwrap();
        let m = w
            .unflatten(0, &[2, 3, 3], &names(&["a", "b", "c"]))
            .unwrap();
        let ac = m.slice(&["a", "c"]).unwrap().flatten(None).unwrap();
        let e = ac.unflatten(0, &[3, 2], &names(&["x", "y"])).unwrap_err();
        assert!(
            matches!(e, LayoutError::Incompatible { ref sizes, .. } if sizes == &[3, 2]),
            "{e:?}"
        );
    }

    #[test]
    fn partition_key_ignores_mode_order() {
        let w = Layout::world(8, None).unwrap();
        let m = w
            .unflatten(0, &[2, 2, 2], &names(&["a", "b", "c"]))
            .unwrap();
        let ac = m.slice(&["a", "c"]).unwrap().flatten(None).unwrap();
        assert_eq!(
            ac.partition_key(0).unwrap(),
            vec![Mode::new(2, 4), Mode::new(2, 1)]
        );
        let full = m.flatten(None).unwrap();
        assert_eq!(full.partition_key(0).unwrap(), vec![Mode::new(8, 1)]);
        let tp_dp = Layout::from_parts(
            w.world_arc().clone(),
            &[vec![Mode::new(4, 1), Mode::new(2, 4)]],
            &names(&["x"]),
        )
        .unwrap();
        assert_eq!(tp_dp.partition_key(0).unwrap(), vec![Mode::new(8, 1)]);
    }

    #[test]
    fn offsets_are_lexicographic() {
        let modes = [Mode::new(2, 8), Mode::new(3, 1)];
        assert_eq!(offsets(&modes), vec![0, 1, 2, 8, 9, 10]);
        assert_eq!(offsets(&[]), vec![0]);
    }

    #[test]
    fn complement_matches_torch() {
        // torch: complement((4:1), 8) == (2:4) ; complement((2:4), 8) == (4:1)
        assert_eq!(complement(&[Mode::new(4, 1)], 8), vec![Mode::new(2, 4)]);
        assert_eq!(complement(&[Mode::new(2, 4)], 8), vec![Mode::new(4, 1)]);
        // gaps on both sides, outermost first: (2:2) in 16 -> (4,2):(4,1)
        assert_eq!(
            complement(&[Mode::new(2, 2)], 16),
            vec![Mode::new(4, 4), Mode::new(2, 1)]
        );
    }

    #[test]
    fn bad_inputs_are_typed() {
        use LayoutError as E;
        let int = Value::Int;
        assert_eq!(
            Layout::world(0, None).unwrap_err(),
            E::InvalidSize {
                field: "world_size".into(),
                value: 0
            }
        );
        let e = Layout::world(1 << 31, None).unwrap_err();
        assert!(
            matches!(&e, E::Overflow { field, value, .. } if field == "world_size" && *value == int(1 << 31)),
            "{e:?}"
        );
        // rank maps: the value is the duplicated rank, the entry out of range, or the length
        let e = Layout::world(3, Some(&[0, 1, 1])).unwrap_err();
        assert!(
            matches!(&e, E::InvalidRankMap { value, .. } if *value == int(1)),
            "{e:?}"
        );
        let e = Layout::world(3, Some(&[0, 1])).unwrap_err();
        assert!(
            matches!(&e, E::InvalidRankMap { value, .. } if *value == int(2)),
            "{e:?}"
        );
        let e = Layout::world(3, Some(&[0, 1, 3])).unwrap_err();
        assert!(
            matches!(&e, E::InvalidRankMap { value, .. } if *value == int(3)),
            "{e:?}"
        );
        let w = Layout::world(8, None).unwrap();
        let e = w
            .unflatten(0, &[2, 0, 4], &names(&["a", "b", "c"]))
            .unwrap_err();
        assert_eq!(
            e,
            E::InvalidSize {
                field: "sizes[1]".into(),
                value: 0
            }
        );
        assert_eq!(e.field(), "sizes[1]");
        let e = w.unflatten(0, &[2, 2], &names(&["a", "b"])).unwrap_err();
        assert!(
            matches!(&e, E::SizeMismatch { field, value, .. } if field == "sizes" && *value == Value::Ints(vec![2, 2]))
        );
        let e = w.unflatten(0, &[2, 4], &names(&["a", "a"])).unwrap_err();
        assert_eq!(
            e,
            E::DuplicateName {
                field: "names".into(),
                name: "a".into()
            }
        );
        let e = w.unflatten(0, &[2, 4], &names(&["a"])).unwrap_err();
        assert!(
            matches!(&e, E::SizeMismatch { field, value, .. } if field == "names" && *value == Value::Names(names(&["a"])))
        );
        // the overflow blames the size that makes the product overflow, not "the product"
        let big = (1i128 << 31) - 1;
        let e = w
            .unflatten(0, &[big, big, big], &names(&["a", "b", "c"]))
            .unwrap_err();
        assert!(
            matches!(&e, E::Overflow { field, value, .. } if field == "sizes[2]" && *value == int(big)),
            "{e:?}"
        );
        let e = w
            .unflatten(0, &[4, big + 1], &names(&["a", "b"]))
            .unwrap_err();
        assert!(
            matches!(&e, E::Overflow { field, value, .. } if field == "sizes[1]" && *value == int(big + 1)),
            "{e:?}"
        );
        let m = w.unflatten(0, &[2, 4], &names(&["dp", "tp"])).unwrap();
        assert!(matches!(
            m.slice(&["tp", "dp"]).unwrap_err(),
            E::SliceOrder { .. }
        ));
        assert!(matches!(
            m.slice(&["pp"]).unwrap_err(),
            E::UnknownName { .. }
        ));
        assert!(matches!(
            m.slice::<&str>(&[]).unwrap_err(),
            E::EmptySlice { .. }
        ));
        assert!(matches!(
            m.slice(&["dp", "dp"]).unwrap_err(),
            E::DuplicateName { .. }
        ));
        assert_eq!(
            m.group(8, 0).unwrap_err(),
            E::RankOutOfRange {
                rank: 8,
                world_size: 8
            }
        );
        assert_eq!(
            m.group(-1, 0).unwrap_err(),
            E::RankOutOfRange {
                rank: -1,
                world_size: 8
            }
        );
        assert!(matches!(
            m.dim_index(2).unwrap_err(),
            E::DimOutOfRange {
                dim: 2,
                ndim: 2,
                ..
            }
        ));
        assert_eq!(m.dim_index(-1).unwrap(), 1);
    }

    #[test]
    fn flatten_refuses_a_name_of_the_root() {
        use LayoutError as E;
        let w = Layout::world(8, None).unwrap();
        let m = w.unflatten(0, &[2, 4], &names(&["dp", "tp"])).unwrap();
        assert_eq!(m.root_names(), names(&["world"]).as_slice());
        let dp = m.slice(&["dp"]).unwrap();
        let e = dp.flatten(Some("world")).unwrap_err();
        assert!(
            matches!(&e, E::RootNameTaken { field, name, root }
                if field == "name" && name == "world" && *root == names(&["world"])),
            "{e:?}"
        );
        assert_eq!(e.field(), "name");
        assert!(e.to_string().contains("e.g. \"world_flat\""), "{e}");
        // the default name is refused alike
        let root = Layout::from_parts(
            w.world_arc().clone(),
            &[
                vec![Mode::new(2, 4)],
                vec![Mode::new(2, 2)],
                vec![Mode::new(2, 1)],
            ],
            &names(&["dp", "tp", "dp_tp"]),
        )
        .unwrap();
        assert!(matches!(
            root.slice(&["dp", "tp"]).unwrap().flatten(None),
            Err(E::RootNameTaken { ref name, .. }) if name == "dp_tp"
        ));
        // as in torch: a name of the mesh itself is free (only the root's are taken), and a 1-D
        // layout flattened into its own name is itself
        assert_eq!(dp.flatten(Some("tp")).unwrap().names(), names(&["tp"]));
        assert_eq!(w.flatten(Some("world")).unwrap(), w);
        assert_eq!(w.flatten(None).unwrap(), w);
        assert_eq!(dp.flatten(Some("dp")).unwrap(), dp);
        // unflatten, slice and flatten keep the root, however deep
        let deep = m
            .flatten(Some("all"))
            .unwrap()
            .unflatten(0, &[4, 2], &names(&["a", "b"]))
            .unwrap()
            .slice(&["b"])
            .unwrap();
        assert!(matches!(
            deep.flatten(Some("world")),
            Err(E::RootNameTaken { ref root, .. }) if *root == names(&["world"])
        ));
        // raw modes start a root of their own; the root takes no part in equality
        let raw = Layout::from_parts(
            w.world_arc().clone(),
            &[vec![Mode::new(2, 4)], vec![Mode::new(4, 1)]],
            &names(&["dp", "tp"]),
        )
        .unwrap();
        assert_eq!(raw, m);
        assert_eq!(raw.fingerprint(), m.fingerprint());
        let raw_dp = raw.slice(&["dp"]).unwrap();
        assert_eq!(
            raw_dp.flatten(Some("world")).unwrap().names(),
            names(&["world"])
        );
        assert!(matches!(
            raw_dp.flatten(Some("tp")),
            Err(E::RootNameTaken { ref name, .. }) if name == "tp"
        ));
        // a restored root (unpickling) is validated, and then refused like any root
        let e = raw
            .clone()
            .with_root_names(&names(&["x", "x"]))
            .unwrap_err();
        assert!(
            matches!(&e, E::DuplicateName { field, name } if field == "root_names" && name == "x"),
            "{e:?}"
        );
        let restored = raw_dp.with_root_names(&names(&["world"])).unwrap();
        assert!(matches!(
            restored.flatten(Some("world")),
            Err(E::RootNameTaken { .. })
        ));
    }

    #[test]
    fn raw_parts_are_validated_with_the_mode_named() {
        use LayoutError as E;
        let w = Layout::world(8, None).unwrap().world_arc().clone();
        let ok = Layout::from_raw_parts(
            w.clone(),
            &[vec![(2, 4)], vec![(4, 1)]],
            &names(&["dp", "tp"]),
        )
        .unwrap();
        assert_eq!(ok.shape(), vec![2, 4]);
        let bad = |axes: &[Vec<(i128, i128)>]| {
            let n: Vec<String> = (0..axes.len()).map(|i| format!("d{i}")).collect();
            Layout::from_raw_parts(w.clone(), axes, &n).unwrap_err()
        };
        let e = bad(&[vec![(2, 4)], vec![(-4, 1)]]);
        assert!(
            matches!(&e, E::InvalidLayout { field, value, .. } if field == "axes[1][0]" && *value == Value::Ints(vec![-4, 1])),
            "{e:?}"
        );
        let huge = 1i128 << 64;
        let e = bad(&[vec![(2, 4), (4, huge)]]);
        assert!(
            matches!(&e, E::Overflow { field, value, .. } if field == "axes[0][1][1]" && *value == Value::Int(huge)),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("stride of mode (4, 18446744073709551616) does not fit 64 bits"),
            "{e}"
        );
        // a span beyond 64 bits is just a mode larger than the world
        let e = bad(&[vec![(4, 1 << 63)], vec![(2, 1)]]);
        assert!(
            matches!(&e, E::InvalidLayout { field, .. } if field == "axes[0][0]"),
            "{e:?}"
        );
        let e = bad(&[vec![(2, 4)], vec![(4, 2)]]);
        assert!(
            matches!(&e, E::InvalidLayout { field, value, .. }
            if field == "axes" && *value == Value::Modes(vec![vec![(2, 4)], vec![(4, 2)]])),
            "{e:?}"
        );
    }

    #[test]
    fn slice_order_hint_is_an_order_that_slices() {
        // mesh order is position order, which need not be stride order (from raw modes) nor the
        // order of an earlier mesh (names from a flatten then an unflatten)
        let w = Layout::world(24, None).unwrap();
        let m = w
            .unflatten(0, &[2, 3, 4], &names(&["a", "b", "c"]))
            .unwrap();
        let raw = |axes: Vec<Vec<Mode>>, n: &[&str]| {
            Layout::from_parts(w.world_arc().clone(), &axes, &names(n)).unwrap()
        };
        let layouts = [
            m.clone(),
            // tp innermost but first; a flattened dim "pp_b" second
            raw(
                vec![
                    vec![Mode::new(4, 1)],
                    vec![Mode::new(2, 12), Mode::new(3, 4)],
                ],
                &["tp", "pp_b"],
            ),
            raw(
                vec![
                    vec![Mode::new(4, 1)],
                    vec![Mode::new(2, 12)],
                    vec![Mode::new(3, 4)],
                ],
                &["tp", "pp", "b"],
            ),
            m.slice(&["a", "c"])
                .unwrap()
                .flatten(None)
                .unwrap()
                .unflatten(0, &[2, 2, 2], &names(&["x", "y", "z"]))
                .unwrap(),
            m.unflatten(2, &[2, 2], &names(&["c0", "c1"])).unwrap(),
        ];
        for l in &layouts {
            let n = l.names().to_vec();
            for k in 2..=n.len() {
                for_each_permutation(&n, k, &mut |p: &[String]| {
                    if let Err(LayoutError::SliceOrder {
                        fix, names: given, ..
                    }) = l.slice(p)
                    {
                        assert_eq!(given, p);
                        let fixed = l
                            .slice(&fix)
                            .unwrap_or_else(|e| panic!("hint {fix:?} for {p:?} fails: {e}"));
                        let mut a = fix.clone();
                        let mut b = p.to_vec();
                        a.sort();
                        b.sort();
                        assert_eq!(a, b);
                        assert_eq!(fixed.names(), fix);
                    }
                });
            }
        }
    }

    /// Calls `f` with every ordered selection of `k` distinct items of `items`.
    fn for_each_permutation(items: &[String], k: usize, f: &mut dyn FnMut(&[String])) {
        fn go(items: &[String], k: usize, cur: &mut Vec<String>, f: &mut dyn FnMut(&[String])) {
            if cur.len() == k {
                return f(cur);
            }
            for it in items {
                if !cur.contains(it) {
                    cur.push(it.clone());
                    go(items, k, cur, f);
                    cur.pop();
                }
            }
        }
        go(items, k, &mut Vec::new(), f)
    }

    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        let w = Layout::world(8, None).unwrap();
        let a = w.unflatten(0, &[2, 4], &names(&["dp", "tp"])).unwrap();
        let b = Layout::world(8, Some(&[0, 1, 2, 3, 4, 5, 6, 7]))
            .unwrap()
            .unflatten(0, &[2, 4], &names(&["dp", "tp"]))
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = w.unflatten(0, &[4, 2], &names(&["dp", "tp"])).unwrap();
        let d = w.unflatten(0, &[2, 4], &names(&["dp", "cp"])).unwrap();
        let e = Layout::world(8, Some(&[1, 0, 2, 3, 4, 5, 6, 7]))
            .unwrap()
            .unflatten(0, &[2, 4], &names(&["dp", "tp"]))
            .unwrap();
        for x in [&c, &d, &e] {
            assert_ne!(a.fingerprint(), x.fingerprint());
        }
        // pinned value: the fingerprint must not change across releases or platforms
        assert_eq!(a.fingerprint(), PINNED_FINGERPRINT);
    }

    #[test]
    fn placed_worlds_map_indices_to_ranks_and_back() {
        // students on ranks [8, 16) of 32 as (dp = 2, tp = 4); a strided range; two nested modes
        for (offset, modes) in [
            (8i128, vec![(8i128, 1i128)]),
            (1, vec![(8, 4)]),
            (3, vec![(2, 16), (4, 2)]),
        ] {
            let w = World::placed(32, offset, &modes).unwrap();
            let ranks = w.ranks().unwrap();
            assert_eq!(ranks.len() as u64, w.size());
            let mut members = 0;
            for r in 0..32i128 {
                match w.index_of(r) {
                    Ok(i) => {
                        members += 1;
                        assert_eq!(ranks[i as usize] as i128, r);
                        assert_eq!(w.rank_at(i) as i128, r);
                    }
                    Err(e) => {
                        assert!(!ranks.contains(&(r as i32)));
                        assert!(matches!(e, LayoutError::NotAMember { .. }), "{e}");
                    }
                }
            }
            assert_eq!(members, w.size());
        }
        let l = Layout::placed(32, 8, &[(8, 1)])
            .unwrap()
            .unflatten(0, &[2, 4], &names(&["dp", "tp"]))
            .unwrap();
        assert_eq!(l.group(13, 0).unwrap(), vec![9, 13]);
        assert_eq!(l.group(13, 1).unwrap(), vec![12, 13, 14, 15]);
        assert_eq!(l.coordinate_of(13).unwrap(), vec![1, 1]);
        assert_eq!(l.groups(), (8..16).collect::<Vec<i32>>());
        assert!(!l.is_member(3) && l.is_member(8) && !l.is_member(16));
        assert!(matches!(
            l.group(3, 0),
            Err(LayoutError::NotAMember { rank: 3, .. })
        ));
        assert!(matches!(
            l.group(32, 0),
            Err(LayoutError::RankOutOfRange { rank: 32, .. })
        ));
        // every rank in order is the plain world; a placement is part of equality and fingerprint
        assert!(World::placed(8, 0, &[(2, 4), (4, 1)])
            .unwrap()
            .placement()
            .is_none());
        let a = Layout::placed(32, 8, &[(8, 1)]).unwrap();
        let b = Layout::placed(32, 16, &[(8, 1)]).unwrap();
        assert_ne!(a, b);
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_ne!(
            a.fingerprint(),
            Layout::world(8, None).unwrap().fingerprint()
        );
    }

    #[test]
    fn bad_placements_are_typed() {
        let e = World::placed(32, 0, &[(2, 1), (4, 1)]).unwrap_err();
        assert!(
            matches!(e, LayoutError::InvalidLayout { ref field, .. } if field == "modes"),
            "{e}"
        );
        let e = World::placed(32, 30, &[(4, 1)]).unwrap_err();
        assert!(
            matches!(
                e,
                LayoutError::RankOutOfRange {
                    rank: 33,
                    world_size: 32
                }
            ),
            "{e}"
        );
        let e = World::placed(32, -1, &[(4, 1)]).unwrap_err();
        assert!(
            matches!(e, LayoutError::RankOutOfRange { rank: -1, .. }),
            "{e}"
        );
        let e = World::placed(32, 0, &[(0, 1)]).unwrap_err();
        assert!(
            matches!(e, LayoutError::InvalidLayout { ref field, .. } if field == "modes[0]"),
            "{e}"
        );
        let e = World::placed(0, 0, &[(1, 1)]).unwrap_err();
        assert!(matches!(e, LayoutError::InvalidSize { .. }), "{e}");
    }

    const PINNED_FINGERPRINT: u64 = 2829958925554225088;
}

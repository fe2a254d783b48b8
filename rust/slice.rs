//! A set of ranks as one value, in the spirit of Monarch's `ndslice::Slice`: rank
//! `offset + sum(digit_k(i) * stride_k)` at index `i`, the digits being `i` in mixed radix of the
//! modes' sizes (lexicographic, last mode fastest). Validated once, when it is made (positive
//! sizes and strides, modes that do not overlap, so each rank appears once); every query is a
//! method, O(modes) where the modes decide it.
//!
//! It is what a mesh over part of the job is placed at ([`crate::layout::World::placed`]), what a
//! group rankmesh made from a layout holds, what `rankmesh plan --mesh` checks for overlaps and
//! what torchtitan's `spmd_types` layouts are compared by. Worked example: the ranks
//! `[1, 3, 9, 11]` are `1 + (2, 8):(2, 2)`, i.e. offset 1, modes `(2, 8)` then `(2, 2)`:
//!
//! ```
//! use rankmesh::slice::Slice;
//! let s = Slice::recognise(&[1, 3, 9, 11]).unwrap();
//! assert_eq!((s.offset(), s.len()), (1, 4));
//! assert_eq!(s.rank_at(2), 9);
//! assert_eq!(s.index_of(11), Some(3));
//! assert!(!s.contains(5));
//! let r = Slice::range(2, 4, 3).unwrap(); // 2, 5, 8, 11
//! assert_eq!(s.first_shared_rank(&r), Some(11));
//! ```

use crate::error::{LayoutError, Result, Value, MAX_WORLD_SIZE};
use crate::layout::{coalesce, describe_modes, Mode};

/// Offset and (size, stride) modes of a set of distinct ranks (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slice {
    offset: u64,
    /// Coalesced, lexicographic over the index (outermost first), size-1 modes dropped.
    modes: Vec<Mode>,
    /// The same modes sorted by stride, largest first, each with its weight in the index (the
    /// product of the sizes inside it): what [`Slice::index_of`] peels ranks with.
    by_stride: Vec<(Mode, u64)>,
    len: u64,
    /// The largest rank.
    last: u64,
}

impl Slice {
    /// The slice `offset + modes` (outermost first). Sizes and strides must be positive, the
    /// modes must not overlap (sorted by stride, each stride at least the span of the modes inside
    /// it, so each rank appears once), and every rank must fit int32 (torch's ranks).
    pub fn new(offset: i128, modes: &[(i128, i128)]) -> Result<Slice> {
        let limit = format!("of at most {MAX_WORLD_SIZE} (ranks are int32)");
        Slice::bounded(offset, modes, MAX_WORLD_SIZE, &limit)
    }

    /// [`Slice::new`] with every rank, size and stride below `bound` (a job's size), `limit`
    /// saying so in the message about a mode that is not (e.g. "within the world of 8 ranks").
    pub(crate) fn bounded(
        offset: i128,
        modes: &[(i128, i128)],
        bound: u64,
        limit: &str,
    ) -> Result<Slice> {
        if offset < 0 || offset >= bound as i128 {
            return Err(LayoutError::RankOutOfRange {
                rank: offset,
                world_size: bound,
            });
        }
        let mut checked = Vec::with_capacity(modes.len());
        for (k, &(size, stride)) in modes.iter().enumerate() {
            if size <= 0 || stride <= 0 || size > bound as i128 || stride > bound as i128 {
                return Err(LayoutError::InvalidLayout {
                    field: format!("modes[{k}]"),
                    value: Value::Ints(vec![size, stride]),
                    detail: format!(
                        "mode ({size}, {stride}) needs a positive size and stride {limit}"
                    ),
                });
            }
            checked.push(Mode::new(size as u64, stride as u64));
        }
        Slice::from_modes(offset as u64, &checked, bound)
    }

    /// The ranks `start, start + step, ...` (`len` of them), as Python's `range`.
    pub fn range(start: i128, len: i128, step: i128) -> Result<Slice> {
        match len {
            1 => Slice::new(start, &[]),
            _ => Slice::new(start, &[(len, step)]),
        }
    }

    /// Modes already positive (from a layout or [`Slice::new`]): coalesced, then checked for
    /// overlap and for a largest rank below `bound` (the job's size, or int32's limit).
    pub(crate) fn from_modes(offset: u64, modes: &[Mode], bound: u64) -> Result<Slice> {
        let modes = coalesce(modes);
        let mut weights = vec![0u64; modes.len()];
        let mut w = 1u128;
        for (k, m) in modes.iter().enumerate().rev() {
            weights[k] = w.min(u64::MAX as u128) as u64;
            w = w.saturating_mul(m.size as u128);
        }
        let mut by_stride: Vec<(Mode, u64)> = modes.iter().copied().zip(weights).collect();
        by_stride.sort_by_key(|(m, _)| std::cmp::Reverse(m.stride));
        // Non-overlap: inside each mode, the modes of smaller stride span less than its stride.
        let mut span = 1u128; // 1 + the largest offset of the modes seen so far (smallest strides)
        for (m, _) in by_stride.iter().rev() {
            if (m.stride as u128) < span {
                return Err(LayoutError::InvalidLayout {
                    field: "modes".into(),
                    value: Value::Modes(vec![modes.iter().map(|m| (m.size, m.stride)).collect()]),
                    detail: format!(
                        "the modes overlap: stride {} is inside the span {span} of the modes of smaller stride, \
                         so some rank would appear twice; give modes whose strides nest (e.g. (2, 4), (4, 1))",
                        m.stride
                    ),
                });
            }
            span += (m.size as u128 - 1) * m.stride as u128;
        }
        let last = offset as u128 + span - 1;
        if last >= bound as u128 {
            return Err(LayoutError::RankOutOfRange {
                rank: last.min(i128::MAX as u128) as i128,
                world_size: bound,
            });
        }
        Ok(Slice {
            offset,
            len: w as u64, // <= last + 1 (distinct ranks), so it fits
            last: last as u64,
            modes,
            by_stride,
        })
    }

    /// The slice that `ranks` are, in their order (index `i` is `ranks[i]`), or None when they
    /// are no such set (a general subset, a repeated rank, a negative rank). O(len), reading each
    /// rank a few times: the innermost mode is the run `ranks[0], ranks[0] + d, ...` that every
    /// block repeats, then the blocks' first ranks are read the same way.
    pub fn recognise(ranks: &[i64]) -> Option<Slice> {
        let first = *ranks.first()?;
        let mut cur: Vec<i128> = ranks.iter().map(|&r| r as i128 - first as i128).collect();
        // The first rank of a slice is its smallest; every rank fits int32.
        if first < 0
            || cur
                .iter()
                .any(|&r| r < 0 || first as i128 + r >= MAX_WORLD_SIZE as i128)
        {
            return None;
        }
        let mut modes: Vec<Mode> = Vec::new();
        while cur.len() > 1 {
            let stride = cur[1];
            if stride <= 0 {
                return None;
            }
            let size = (0..cur.len())
                .find(|&i| cur[i] != i as i128 * stride)
                .unwrap_or(cur.len());
            if cur.len() % size != 0 {
                return None;
            }
            for block in cur.chunks_exact(size) {
                let base = block[0];
                if block
                    .iter()
                    .enumerate()
                    .any(|(j, &r)| r - base != j as i128 * stride)
                {
                    return None;
                }
            }
            modes.insert(0, Mode::new(size as u64, stride as u64));
            cur = cur.iter().step_by(size).copied().collect();
        }
        Slice::from_modes(first as u64, &modes, MAX_WORLD_SIZE).ok()
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The modes, outermost first (coalesced; none for a single rank).
    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    /// How many ranks.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never: a slice holds at least its offset.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The largest rank.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// Whether the ranks are `start, start + step, ...` with one step (a range).
    pub fn as_range(&self) -> Option<(u64, u64, u64)> {
        match self.modes.as_slice() {
            [] => Some((self.offset, 1, 1)),
            [m] => Some((self.offset, m.size, m.stride)),
            _ => None,
        }
    }

    /// The rank at `index` (`select`): `offset + sum(digit_k * stride_k)`. `index < len`.
    #[inline]
    pub fn rank_at(&self, index: u64) -> u64 {
        let mut rest = index;
        let mut r = self.offset;
        for m in self.modes.iter().rev() {
            r += (rest % m.size) * m.stride;
            rest /= m.size;
        }
        r
    }

    /// The index of `rank`, or None when it is not one of the ranks. O(modes).
    pub fn index_of(&self, rank: u64) -> Option<u64> {
        if rank > self.last {
            return None;
        }
        let mut r = rank.checked_sub(self.offset)?;
        let mut index = 0;
        for &(m, weight) in &self.by_stride {
            let digit = r / m.stride;
            if digit >= m.size {
                return None;
            }
            r -= digit * m.stride;
            index += digit * weight;
        }
        (r == 0).then_some(index)
    }

    /// `rank`'s digit in each mode (outermost first), or None when it is not one of the ranks.
    pub fn coordinates(&self, rank: u64) -> Option<Vec<u64>> {
        let mut rest = self.index_of(rank)?;
        let mut out = vec![0; self.modes.len()];
        for (k, m) in self.modes.iter().enumerate().rev() {
            out[k] = rest % m.size;
            rest /= m.size;
        }
        Some(out)
    }

    pub fn contains(&self, rank: u64) -> bool {
        self.index_of(rank).is_some()
    }

    /// Every rank, in index order. O(len).
    pub fn ranks(&self) -> Vec<u64> {
        (0..self.len).map(|i| self.rank_at(i)).collect()
    }

    /// The ranks in increasing order, one by one (largest stride outermost: the modes nest).
    fn ascending(&self) -> impl Iterator<Item = u64> + '_ {
        let mut digits = vec![0u64; self.by_stride.len()];
        let mut next = Some(self.offset);
        std::iter::from_fn(move || {
            let out = next?;
            next = None;
            let mut r = out;
            for k in (0..digits.len()).rev() {
                let m = self.by_stride[k].0;
                if digits[k] + 1 < m.size {
                    digits[k] += 1;
                    next = Some(r + m.stride);
                    break;
                }
                r -= digits[k] * m.stride;
                digits[k] = 0;
            }
            Some(out)
        })
    }

    /// The least rank in both slices, or None when they share none. O(log stride) for two
    /// ranges (the Chinese remainder theorem); otherwise the smaller slice is walked in increasing
    /// order against the other's O(modes) membership.
    pub fn first_shared_rank(&self, other: &Slice) -> Option<u64> {
        let (lo, hi) = (self.offset.max(other.offset), self.last.min(other.last));
        if lo > hi {
            return None;
        }
        if let (Some(a), Some(b)) = (self.as_range(), other.as_range()) {
            return first_shared_in_ranges(a, b, lo, hi);
        }
        let (small, big) = if self.len <= other.len {
            (self, other)
        } else {
            (other, self)
        };
        small
            .ascending()
            .skip_while(|&r| r < lo)
            .take_while(|&r| r <= hi)
            .find(|&r| big.contains(r))
    }

    /// Whether the slices share a rank.
    pub fn intersects(&self, other: &Slice) -> bool {
        self.first_shared_rank(other).is_some()
    }

    /// Whether every rank of `self` is a rank of `other`, decided from the modes alone in
    /// O(modes), or None when they do not decide it: the slices' offsets must be 0 and the cut
    /// points of both (where each run of free digits starts and ends: modes sorted by stride,
    /// touching ones merged) must form one divisibility chain; then each run of `self` must lie
    /// inside one run of `other`'s.
    pub fn subset_by_modes(&self, other: &Slice) -> Option<bool> {
        if self.offset != 0 || other.offset != 0 {
            return None;
        }
        // Each mode frees the digits from its stride to its span's end; sorted by stride, with
        // touching ranges merged, they are a function of the rank set alone.
        let runs = |s: &Slice| -> Vec<(u128, u128)> {
            let mut merged: Vec<(u128, u128)> = Vec::with_capacity(s.by_stride.len());
            for (m, _) in s.by_stride.iter().rev() {
                let (start, end) = (m.stride as u128, m.size as u128 * m.stride as u128);
                match merged.last_mut() {
                    Some(last) if last.1 == start => last.1 = end,
                    _ => merged.push((start, end)),
                }
            }
            merged
        };
        let (small, big) = (runs(self), runs(other));
        let mut cuts: Vec<u128> = std::iter::once(1)
            .chain(small.iter().chain(&big).flat_map(|&(a, b)| [a, b]))
            .collect();
        cuts.sort();
        cuts.dedup();
        if cuts.windows(2).any(|w| w[1] % w[0] != 0) {
            return None;
        }
        // On one chain every range ends on a cut: inside a run means every digit is free there.
        Some(
            small
                .iter()
                .all(|&(s, e)| big.iter().any(|&(lo, hi)| lo <= s && e <= hi)),
        )
    }

    /// `offset + (sizes):(strides)`, as errors and reprs show a slice.
    pub fn describe(&self) -> String {
        format!("{} + {}", self.offset, describe_modes(&self.modes))
    }
}

/// The least `x` in `[lo, hi]` with `x = a0 (mod da)` and `x = b0 (mod db)` for the ranges
/// `(start, len, step)` `a` and `b` (steps >= 1), `lo`/`hi` their common span.
fn first_shared_in_ranges(a: (u64, u64, u64), b: (u64, u64, u64), lo: u64, hi: u64) -> Option<u64> {
    let (a0, da) = (a.0 as i128, a.2.max(1) as i128);
    let (b0, db) = (b.0 as i128, b.2.max(1) as i128);
    let g = gcd(da, db);
    if (b0 - a0).rem_euclid(g) != 0 {
        return None;
    }
    // x = a0 + da * t with da * t = b0 - a0 (mod db): t = (b0 - a0)/g * inv(da/g) mod db/g.
    let m = db / g;
    let t = ((b0 - a0) / g).rem_euclid(m) * mod_inverse(da / g, m) % m;
    let period = da / g * db;
    let mut x = a0 + da * t;
    let lo = lo as i128;
    if x < lo {
        x += (lo - x + period - 1) / period * period;
    }
    (x <= hi as i128).then_some(x as u64)
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// `a`'s inverse modulo `m` (`gcd(a, m) == 1`); 0 for `m == 1`.
fn mod_inverse(a: i128, m: i128) -> i128 {
    let (mut old_r, mut r) = (a.rem_euclid(m), m);
    let (mut old_s, mut s) = (1i128, 0i128);
    while r != 0 {
        let q = old_r / r;
        (old_r, r) = (r, old_r - q * r);
        (old_s, s) = (s, old_s - q * s);
    }
    old_s.rem_euclid(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute_shared(a: &Slice, b: &Slice) -> Option<u64> {
        let theirs: std::collections::BTreeSet<u64> = b.ranks().into_iter().collect();
        a.ranks().into_iter().filter(|r| theirs.contains(r)).min()
    }

    #[test]
    fn ranges_share_their_least_common_rank() {
        for (s1, n1, d1) in [(0, 5, 3), (1, 7, 2), (4, 1, 1), (2, 6, 5), (0, 10, 1)] {
            for (s2, n2, d2) in [(3, 4, 4), (0, 9, 6), (5, 1, 1), (1, 3, 7), (7, 5, 2)] {
                let (a, b) = (
                    Slice::range(s1, n1, d1).unwrap(),
                    Slice::range(s2, n2, d2).unwrap(),
                );
                assert_eq!(a.first_shared_rank(&b), brute_shared(&a, &b), "{a:?} {b:?}");
                assert_eq!(b.first_shared_rank(&a), brute_shared(&a, &b));
            }
        }
    }

    #[test]
    fn multi_mode_slices_share_their_least_common_rank() {
        let a = Slice::new(1, &[(2, 8), (2, 2)]).unwrap(); // 1 3 9 11
        let b = Slice::new(0, &[(3, 6), (2, 3)]).unwrap(); // 0 3 6 9 12 15
        assert_eq!(a.first_shared_rank(&b), Some(3));
        let c = Slice::new(4, &[(2, 8), (2, 1)]).unwrap(); // 4 5 12 13
        assert_eq!(a.first_shared_rank(&c), None);
        assert!(!a.intersects(&c));
    }

    #[test]
    fn ascending_walks_every_rank_in_order() {
        let s = Slice::new(3, &[(2, 1), (3, 4), (2, 2)]).unwrap();
        let mut want = s.ranks();
        want.sort();
        assert_eq!(s.ascending().collect::<Vec<_>>(), want);
    }

    #[test]
    fn recognise_reads_back_what_new_made() {
        let s = Slice::new(5, &[(3, 16), (2, 1), (2, 4)]).unwrap();
        let ranks: Vec<i64> = s.ranks().into_iter().map(|r| r as i64).collect();
        assert_eq!(Slice::recognise(&ranks), Some(s));
        assert_eq!(
            Slice::recognise(&[0, 2, 1, 3]).map(|s| s.modes().to_vec()),
            Some(vec![Mode::new(2, 1), Mode::new(2, 2)])
        );
        assert_eq!(Slice::recognise(&[0, 1, 3]), None);
        assert_eq!(Slice::recognise(&[2, 1]), None);
        assert_eq!(Slice::recognise(&[1, 1]), None);
        assert_eq!(Slice::recognise(&[]), None);
    }

    #[test]
    fn overlapping_modes_are_refused() {
        let e = Slice::new(0, &[(2, 2), (4, 1)]).unwrap_err();
        assert!(matches!(e, LayoutError::InvalidLayout { ref field, .. } if field == "modes"));
        assert!(Slice::new(0, &[(0, 1)]).is_err());
        assert!(Slice::new(-1, &[]).is_err());
        assert!(Slice::new(0, &[(1 << 20, 1 << 20)]).is_err()); // past int32
    }

    #[test]
    fn coordinates_invert_rank_at() {
        let s = Slice::new(2, &[(2, 12), (3, 4), (2, 1)]).unwrap();
        for i in 0..s.len() {
            let r = s.rank_at(i);
            assert_eq!(s.index_of(r), Some(i));
            let c = s.coordinates(r).unwrap();
            assert_eq!(
                c.iter()
                    .zip(s.modes())
                    .fold(0, |acc, (d, m)| acc * m.size + d),
                i
            );
        }
        assert_eq!(s.index_of(1), None);
        assert_eq!(s.index_of(100), None);
    }

    #[test]
    fn subset_by_modes_decides_chains_only() {
        let s = |m: &[(i128, i128)]| Slice::new(0, m).unwrap();
        assert_eq!(
            s(&[(4, 2)]).subset_by_modes(&s(&[(2, 1), (4, 2)])),
            Some(true)
        );
        assert_eq!(
            s(&[(4, 1)]).subset_by_modes(&s(&[(2, 1), (2, 4)])),
            Some(false)
        );
        assert_eq!(s(&[(2, 3)]).subset_by_modes(&s(&[(4, 2)])), None);
    }
}

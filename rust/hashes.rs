//! Two hashes torch computes in Python, computed here without building their Python inputs.
//!
//! - [`group_name_hash`]: torch's hashed name of a member-only process group
//!   (`torch.distributed.distributed_c10d._hash_ranks_to_str`), the SHA-1 hex digest of
//!   `"_".join(map(str, ranks)) + "_" + str(salt)`, streamed into the hasher in O(members)
//!   without the joined string.
//! - [`cpython_tuple_hash`]: CPython's `hash(tuple)` of a tuple of small non-negative ints, used
//!   for torch's rank-map tuple hash (`DeviceMesh.__hash__` hashes the W-long
//!   `_flatten_rank_map` tuple) without building the tuple.
//!
//! Both are pure functions; the PyO3 glue (`python.rs`) only reads arguments and calls them, and
//! rankmesh's start-up self-check compares each with Python's and torch's own results.

/// CPython's tuple hash (Objects/tupleobject.c, 3.8+, 64-bit) of a tuple of `len` ints whose
/// values are `items`; each item is an int in [0, 2^31), whose hash is its value.
pub fn cpython_tuple_hash(len: u64, items: impl Iterator<Item = i64>) -> i64 {
    const P1: u64 = 11400714785074694791;
    const P2: u64 = 14029467366897019727;
    const P5: u64 = 2870177450012600261;
    let mut acc: u64 = P5;
    for item in items {
        let lane = item as u64;
        acc = acc.wrapping_add(lane.wrapping_mul(P2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(P1);
    }
    acc = acc.wrapping_add(len ^ (P5 ^ 3527539));
    if acc == u64::MAX {
        return 1546275796;
    }
    acc as i64
}

/// torch's hashed name of a member-only process group (`distributed_c10d._hash_ranks_to_str`):
/// the SHA-1 hex digest (40 lowercase hex digits) of `"_".join(map(str, ranks)) + "_" +
/// str(salt)`, computed without building the joined string. `ranks` is the sorted member list.
pub fn group_name_hash(ranks: &[i32], salt: u64) -> String {
    use sha1::{Digest, Sha1};
    let mut h = Sha1::new();
    let mut buf = [0u8; 24];
    for (k, &r) in ranks.iter().enumerate() {
        if k > 0 {
            h.update(b"_");
        }
        if r < 0 {
            h.update(b"-");
        }
        let start = decimal(r.unsigned_abs() as u64, &mut buf);
        h.update(&buf[start..]);
    }
    h.update(b"_");
    let start = decimal(salt, &mut buf);
    h.update(&buf[start..]);
    let digest = h.finalize();
    let mut out = String::with_capacity(40);
    for b in digest.iter() {
        out.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
        out.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
    }
    out
}

/// Writes `v` in decimal at the end of `buf`; returns where the digits start.
fn decimal(v: u64, buf: &mut [u8; 24]) -> usize {
    let (mut i, mut v) = (buf.len(), v);
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return i;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple_hash(items: &[i64]) -> i64 {
        cpython_tuple_hash(items.len() as u64, items.iter().copied())
    }

    // Expected values computed with CPython 3.11.7, 64-bit:
    //   python3 -c 'print(hash((1,2,3)), hash(()), hash((0,)), hash(tuple(range(100))),
    //                     hash((2**31-1, 7)))'
    #[test]
    fn tuple_hash_matches_cpython() {
        assert_eq!(tuple_hash(&[1, 2, 3]), 529344067295497451);
        assert_eq!(tuple_hash(&[]), 5740354900026072187);
        assert_eq!(tuple_hash(&[0]), -8753497827991233192);
        let range: Vec<i64> = (0..100).collect();
        assert_eq!(tuple_hash(&range), 4479737025582696436);
        assert_eq!(tuple_hash(&[(1 << 31) - 1, 7]), -9188853653830996564);
    }

    // Expected digests computed with Python 3.11.7's hashlib:
    //   python3 -c 'import hashlib
    //   h = lambda r, s: hashlib.sha1(("_".join(map(str, r)) + "_" + str(s)).encode()).hexdigest()
    //   print(h([0,1,2,3], 5))'        # = hashlib.sha1(b"0_1_2_3_5").hexdigest()
    // and likewise for each case below.
    #[test]
    fn group_name_hash_matches_torch_formula() {
        // b"0_1_2_3_5"
        assert_eq!(
            group_name_hash(&[0, 1, 2, 3], 5),
            "075c7fc5bdfb9714220f5b10390c2cf9fd2070a9"
        );
        // no ranks: "_".join([]) + "_0" == "_0"
        assert_eq!(
            group_name_hash(&[], 0),
            "f5194ff3ac4c1d8bc045b0ddf7ecba6e2b4e2859"
        );
        // b"7_3"
        assert_eq!(
            group_name_hash(&[7], 3),
            "929e7cb81c68bd3fe9b44e099270771366f40319"
        );
        // b"-1_4_2": a negative rank is written as str() writes it
        assert_eq!(
            group_name_hash(&[-1, 4], 2),
            "3eda9ae961358d339322fc1fd6e0eebbf9d21525"
        );
        // b"-2147483648_0": i32::MIN, whose absolute value does not fit an i32
        assert_eq!(
            group_name_hash(&[i32::MIN], 0),
            "a4a3dbb4cf75ddabc2d5df99a981b03ab229ad03"
        );
        // b"1048575_18446744073709551615": a large rank and the largest salt
        assert_eq!(
            group_name_hash(&[1048575], u64::MAX),
            "818985d66702c9659965a38676a4946c616126e5"
        );
        // b"0_1048575_1"
        assert_eq!(
            group_name_hash(&[0, 1048575], 1),
            "b9bd52d33627e0ed0a307ef26a63b5693b4f7d66"
        );
    }

    #[test]
    fn decimal_writes_digits_at_the_end() {
        let mut buf = [0u8; 24];
        let start = decimal(0, &mut buf);
        assert_eq!(&buf[start..], b"0");
        let start = decimal(u64::MAX, &mut buf);
        assert_eq!(&buf[start..], b"18446744073709551615");
    }
}

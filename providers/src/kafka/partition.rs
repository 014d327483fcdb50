//! Which partition a keyed record goes to: Kafka's default partitioner
//! (the Java client's, and librdkafka's `murmur2_random` that the relay's
//! producer uses), `(murmur2(key) & 0x7fffffff) % partitions`. Reconcile
//! uses it to search the partitions a keyed record can be in.

/// Kafka's 32-bit murmur2 (seed `0x9747b28c`), as `Utils.murmur2` computes
/// it: little-endian 4-byte blocks, the tail folded in from its highest
/// byte down.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ (data.len() as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a record with `key` in a topic of `partitions`
/// partitions (at least one).
pub fn for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Every partition a record with `key` may be in, in a topic that has
/// `partitions` partitions now: the one each earlier count would have
/// chosen. A topic's partitions are only ever added, so a record written
/// when the topic had fewer (the producer's count at the time, which the
/// search cannot know) is where one of the counts from 1 up put it.
pub fn candidates(key: &[u8], partitions: i32) -> Vec<i32> {
    let mut all: Vec<i32> = (1..=partitions.max(1)).map(|n| for_key(key, n)).collect();
    all.sort_unstable();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known answers of Kafka's own test of `Utils.murmur2`.
    #[test]
    fn kafkas_known_answers() {
        for (data, hash) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(data), hash, "{:?}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn partitions_are_in_range() {
        for key in ["", "a", "account-17", "é"] {
            for n in [1, 3, 7, 64] {
                let p = for_key(key.as_bytes(), n);
                assert!((0..n).contains(&p), "{key} {n} {p}");
            }
        }
    }

    #[test]
    fn the_candidates_cover_every_earlier_count() {
        for key in ["acct-2", "a", "order-17"] {
            let now = candidates(key.as_bytes(), 6);
            for n in 1..=6 {
                assert!(now.contains(&for_key(key.as_bytes(), n)), "{key} {n}");
            }
            assert!(now.windows(2).all(|w| w[0] < w[1]), "{now:?}");
            assert!(now.iter().all(|p| (0..6).contains(p)), "{now:?}");
        }
        assert_eq!(candidates(b"a", 1), [0]);
    }
}

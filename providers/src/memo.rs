//! A per-thread cache of a pure function of a short text, such as a
//! webhook URL parsed and checked.
//!
//! A delivery reads its URL several times (its room at the host, its
//! destination's health, the request itself), and webhooks go to few
//! distinct URLs: parsing each text once per thread, instead of on every
//! read, took an eighth off the instructions the relay executes per
//! webhook (docs/performance.md, "What a job costs the machine").
//!
//! Entries are never stale, since the function is pure; the cache is
//! bounded by clearing it whole when it is full, and texts longer than
//! [`MAX_TEXT`] are never kept.

use std::cell::RefCell;
use std::collections::HashMap;
use std::thread::LocalKey;

/// Entries one thread keeps for one function.
pub const CAPACITY: usize = 256;

/// The longest text kept, in bytes: at most `CAPACITY × MAX_TEXT` (512 KiB)
/// of keys per thread and function.
pub const MAX_TEXT: usize = 2048;

/// The cache's storage: `thread_local!` a `Texts<V>` and pass it to
/// [`cached`].
pub type Texts<V> = RefCell<HashMap<Box<str>, V>>;

/// `f(text)`, from `cache` when this thread has computed it already.
/// `f` must not read the same cache.
pub fn cached<V: Clone>(
    cache: &'static LocalKey<Texts<V>>,
    text: &str,
    f: impl FnOnce(&str) -> V,
) -> V {
    if let Some(v) = cache.with_borrow(|m| m.get(text).cloned()) {
        return v;
    }
    let v = f(text);
    if text.len() <= MAX_TEXT {
        cache.with_borrow_mut(|m| {
            if m.len() >= CAPACITY {
                m.clear();
            }
            m.insert(text.into(), v.clone());
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static LENGTHS: Texts<usize> = RefCell::new(HashMap::new());
        static CALLS: Cell<usize> = const { Cell::new(0) };
    }

    fn length(text: &str) -> usize {
        cached(&LENGTHS, text, |t| {
            CALLS.set(CALLS.get() + 1);
            t.len()
        })
    }

    #[test]
    fn a_text_is_computed_once_and_then_read_back() {
        assert_eq!(length("http://a.example/hook"), 21);
        assert_eq!(length("http://a.example/hook"), 21);
        assert_eq!(length("http://b.example/"), 17);
        assert_eq!(CALLS.get(), 2);
    }

    #[test]
    fn the_cache_stays_bounded_and_long_texts_are_not_kept() {
        for i in 0..CAPACITY * 3 {
            length(&format!("http://h{i}.example/"));
        }
        assert!(LENGTHS.with_borrow(|m| m.len()) <= CAPACITY);
        let long = "x".repeat(MAX_TEXT + 1);
        let before = CALLS.get();
        assert_eq!(length(&long), MAX_TEXT + 1);
        assert_eq!(length(&long), MAX_TEXT + 1);
        assert_eq!(CALLS.get(), before + 2, "a long text is computed each time");
        assert!(LENGTHS.with_borrow(|m| !m.contains_key(long.as_str())));
    }
}

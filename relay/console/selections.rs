//! The sets bulk actions' dry runs counted, kept until they are confirmed:
//! a confirmation changes only intents of its dry run's set (those that
//! left the filter since are skipped), never one that joined the filter
//! after the count.
//!
//! In memory, bounded: at most [`MAX_SELECTED`] ids per dry run, at most
//! [`KEPT_IDS`] ids in all (the oldest sets go first), each kept for
//! [`KEPT_FOR`]. A set that is gone (expired, pushed out, or the console
//! restarted) is refused at confirmation: the dry run is run again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::console::Search;

/// Intents one bulk action acts on at most.
pub const MAX_SELECTED: i64 = 1_000_000;
/// Ids kept across all dry runs (8 bytes each).
const KEPT_IDS: usize = 4_000_000;
/// Dry runs kept at most.
const KEPT_SETS: usize = 200;
/// How long a dry run can be confirmed.
pub const KEPT_FOR: Duration = Duration::from_secs(3600);

/// What one dry run counted.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Whose dry run it was: only they can confirm it.
    pub user: String,
    /// The action's label and the search as counted (the confirmation's
    /// must be the same).
    pub label: String,
    pub search: Search,
    pub up_to: i64,
    /// The intents counted, in id order.
    pub ids: Arc<Vec<i64>>,
    made: Instant,
}

impl Selection {
    pub fn new(user: &str, label: String, search: Search, up_to: i64, ids: Vec<i64>) -> Self {
        Selection {
            user: user.to_string(),
            label,
            search,
            up_to,
            ids: Arc::new(ids),
            made: Instant::now(),
        }
    }

    /// Whether a confirmation of `label` over `search` as `user` confirms
    /// this dry run.
    pub fn confirms(&self, user: &str, label: &str, search: &Search, up_to: i64) -> bool {
        self.user == user && self.label == label && self.search == *search && self.up_to == up_to
    }
}

#[derive(Debug, Default)]
struct State {
    sets: HashMap<String, Selection>,
}

impl State {
    fn ids(&self) -> usize {
        self.sets.values().map(|s| s.ids.len()).sum()
    }
}

/// The dry runs waiting for their confirmation.
#[derive(Debug, Clone, Default)]
pub struct Selections {
    state: Arc<Mutex<State>>,
}

impl Selections {
    fn lock(&self) -> MutexGuard<'_, State> {
        // its holders only touch the map and a count: nothing is left half-changed
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `selection` under `token` (a random token the dry run hands out).
    pub fn keep(&self, token: &str, selection: Selection) {
        let mut state = self.lock();
        state.sets.retain(|_, s| s.made.elapsed() < KEPT_FOR);
        let size = selection.ids.len();
        while !state.sets.is_empty()
            && (state.sets.len() >= KEPT_SETS || state.ids() + size > KEPT_IDS)
        {
            let oldest = state
                .sets
                .iter()
                .min_by_key(|(_, s)| s.made)
                .map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                state.sets.remove(&t);
            }
        }
        state.sets.insert(token.to_string(), selection);
    }

    /// The dry run kept under `token`, if it is still kept.
    pub fn get(&self, token: &str) -> Option<Selection> {
        self.lock()
            .sets
            .get(token)
            .filter(|s| s.made.elapsed() < KEPT_FOR)
            .cloned()
    }

    /// The newest dry run `user` made of `label` over `search` up to
    /// `up_to` (for a confirmation that does not name its dry run's token),
    /// with its token.
    pub fn find(
        &self,
        user: &str,
        label: &str,
        search: &Search,
        up_to: i64,
    ) -> Option<(String, Selection)> {
        self.lock()
            .sets
            .iter()
            .filter(|(_, s)| s.made.elapsed() < KEPT_FOR && s.confirms(user, label, search, up_to))
            .max_by_key(|(_, s)| s.made)
            .map(|(t, s)| (t.clone(), s.clone()))
    }

    /// Forget the dry run under `token` (its job started).
    pub fn forget(&self, token: &str) {
        self.lock().sets.remove(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_sets_go_first_past_the_bound() {
        let kept = Selections::default();
        let big = (0..(KEPT_IDS as i64 / 2)).collect::<Vec<_>>();
        for t in ["a", "b", "c"] {
            kept.keep(
                t,
                Selection::new("u", "Cancel".into(), Search::default(), 1, big.clone()),
            );
        }
        assert!(kept.get("a").is_none(), "pushed out");
        assert!(kept.get("b").is_some() && kept.get("c").is_some());
        assert!(kept.lock().ids() <= KEPT_IDS);
        let (token, found) = kept.find("u", "Cancel", &Search::default(), 1).unwrap();
        assert_eq!(token, "c", "the newest");
        assert!(Arc::ptr_eq(&found.ids, &kept.get("c").unwrap().ids));
        assert!(
            kept.find("v", "Cancel", &Search::default(), 1).is_none(),
            "another user's"
        );
        assert!(kept.find("u", "Cancel", &Search::default(), 2).is_none());
    }
}

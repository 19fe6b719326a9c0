//! A value that a reload of the configuration replaces while the gateway runs (`POST
//! /admin/reload`, SIGHUP): whoever reads it takes the current one and keeps it for what it is
//! doing, so a session or a request never sees half of one setting set and half of another.

use std::sync::{Arc, RwLock};

pub struct Live<T>(RwLock<Arc<T>>);

impl<T> Live<T> {
    pub fn new(value: T) -> Self {
        Self(RwLock::new(Arc::new(value)))
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        // A poisoned lock only means a writer panicked between two whole values: the one
        // stored is still whole.
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// From now on, `value` is the current one; those taken before keep theirs.
    pub fn replace(&self, value: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_taken_before_a_replace_stays_as_it_was() {
        let live = Live::new(1);
        let before = live.get();
        live.replace(2);
        assert_eq!((*before, *live.get()), (1, 2));
    }
}

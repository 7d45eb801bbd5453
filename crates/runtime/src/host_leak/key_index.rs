//! A hash table of packed stack keys that keeps each key's hash beside it. A Python process
//! interns a million keys; a table that recomputed hashes when it grows would read every boxed
//! key again (a cache miss each), and a lookup would follow a box for every near-miss. Here
//! growing moves hashes, and a key's words are read only when the full hash already matched.

use hashbrown::HashTable;

struct Stored<V> {
    hash: u64,
    key: Box<[u64]>,
    value: V,
}

pub struct KeyIndex<V> {
    table: HashTable<Stored<V>>,
}

impl<V> Default for KeyIndex<V> {
    fn default() -> Self {
        KeyIndex {
            table: HashTable::new(),
        }
    }
}

impl<V> KeyIndex<V> {
    /// The value of `key`, whose hash is `hash`.
    #[inline]
    pub fn get(&self, hash: u64, key: &[u64]) -> Option<&V> {
        self.table
            .find(hash, |s| s.hash == hash && *s.key == *key)
            .map(|s| &s.value)
    }

    /// Adds `key` (not in the table: the caller looked it up under the same lock).
    pub fn insert_new(&mut self, hash: u64, key: &[u64], value: V) {
        self.table.insert_unique(
            hash,
            Stored {
                hash,
                key: key.into(),
                value,
            },
            |s| s.hash,
        );
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.table.retain(|s| keep(&mut s.value));
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u64], &V)> {
        self.table.iter().map(|s| (&*s.key, &s.value))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_by_words_even_when_hashes_collide() {
        let mut index = KeyIndex::default();
        index.insert_new(7, &[1, 2, 3], 'a');
        index.insert_new(7, &[1, 2], 'b');
        index.insert_new(9, &[4], 'c');
        assert_eq!(index.get(7, &[1, 2, 3]), Some(&'a'));
        assert_eq!(index.get(7, &[1, 2]), Some(&'b'));
        assert_eq!(index.get(9, &[1, 2]), None);
        assert_eq!(index.get(9, &[4]), Some(&'c'));
        for i in 0..10_000u64 {
            index.insert_new(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), &[i, i + 1], 'x');
        }
        assert_eq!(index.get(7, &[1, 2, 3]), Some(&'a'), "kept while growing");
        assert_eq!(
            index.get(500u64.wrapping_mul(0x9E37_79B9_7F4A_7C15), &[500, 501]),
            Some(&'x')
        );
        index.retain(|v| *v != 'x');
        assert_eq!(index.len(), 3);
        let mut keys: Vec<Vec<u64>> = index.iter().map(|(k, _)| k.to_vec()).collect();
        keys.sort();
        assert_eq!(keys, vec![vec![1, 2], vec![1, 2, 3], vec![4]]);
    }
}

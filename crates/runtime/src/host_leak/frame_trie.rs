//! Python call paths as text, stored once per distinct prefix. A site keeps one node id: the
//! node of its innermost frame, whose parents are its callers. The stacks of a Python program
//! share their outer frames (the import machinery's, a training loop's callers), so a path of
//! twenty frames costs one node where it differs from every path seen before, not twenty text
//! pointers per site.
//!
//! Paths arrive as the interpreter holds them (code object, instruction, and the objects the
//! text is read from: `python::RenderKey`). Each (caller's node, raw frame) pair is turned into
//! text once and remembered, so a new stack whose frames were all seen under the same callers
//! costs one lookup per frame: no text is decoded, compared or reference-counted.

use std::collections::HashMap;
use std::sync::Arc;

use crate::hashing::FastHash;
use crate::python::RenderKey;

/// Past this many remembered (caller, raw frame) pairs (2.5 MiB) they are forgotten and
/// relearned (the texts stay in the nodes): a training step's pairs then stay in the processor's
/// cache, where a table holding every pair an `import torch` made (millions, most never seen
/// again: module bodies run once) would miss on each lookup. Measured on a 3-epoch DataLoader
/// loop: 4.1x -> 3.6x the run without a tool.
const RAW_CAP: usize = 1 << 16;

/// The parent of an outermost frame.
const ROOT: u32 = u32::MAX;

/// A node's frame text and its caller's node.
struct Node {
    parent: u32,
    text: Arc<str>,
}

#[derive(Default)]
pub struct FrameTrie {
    nodes: Vec<Node>,
    /// (parent, text pointer) -> node. Equal texts are one `Arc` (`python::render_text`), so
    /// the pointer stands for the text while the node holds it.
    children: HashMap<(u32, usize), u32, FastHash>,
    /// (parent, raw frame) -> node: what a frame the interpreter holds reads as under that
    /// caller. `RenderKey` names the objects its text comes from, so a freed code object's
    /// address reused by another code object is another key.
    raw: HashMap<(u32, RenderKey), u32, FastHash>,
    /// The raw frames of the last path interned, outermost first, with their nodes. The next
    /// stack usually shares its callers (the next line of the same function, a loop's next
    /// allocation): those frames are compared, not looked up.
    last: Vec<(RenderKey, u32)>,
}

impl FrameTrie {
    /// The node of the path `frames` (innermost first); `None` for an empty path, or when the
    /// trie holds `u32::MAX - 1` nodes already.
    #[cfg(test)]
    pub fn intern(&mut self, frames: &[Arc<str>]) -> Option<u32> {
        let mut node = ROOT;
        for text in frames.iter().rev() {
            node = self.child(node, text)?;
        }
        (node != ROOT).then_some(node)
    }

    /// The node of the path of raw frames `frames` (innermost first), each made text by
    /// `text_of` the first time it is seen under its caller's node. `None` as for `intern`.
    pub fn intern_raw(
        &mut self,
        frames: &[RenderKey],
        mut text_of: impl FnMut(&RenderKey) -> Arc<str>,
    ) -> Option<u32> {
        let shared = self
            .last
            .iter()
            .zip(frames.iter().rev())
            .take_while(|(last, key)| last.0 == **key)
            .count();
        self.last.truncate(shared);
        let mut node = self.last.last().map_or(ROOT, |&(_, node)| node);
        for key in frames.iter().rev().skip(shared) {
            node = match self.raw.get(&(node, *key)) {
                Some(&child) => child,
                None => {
                    let child = self.child(node, &text_of(key))?;
                    if self.raw.len() >= RAW_CAP {
                        self.raw.clear();
                    }
                    self.raw.insert((node, *key), child);
                    child
                }
            };
            self.last.push((*key, node));
        }
        (node != ROOT).then_some(node)
    }

    /// The node of `text` called from `parent`, made when new.
    fn child(&mut self, parent: u32, text: &Arc<str>) -> Option<u32> {
        let key = (parent, Arc::as_ptr(text) as *const u8 as usize);
        if let Some(&child) = self.children.get(&key) {
            return Some(child);
        }
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&id| id < ROOT)?;
        self.nodes.push(Node {
            parent,
            text: text.clone(),
        });
        self.children.insert(key, id);
        Some(id)
    }

    /// The frames of the path ending at `node`, innermost first.
    pub fn path(&self, node: u32) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = node;
        while let Some(n) = self.nodes.get(at as usize) {
            out.push(n.text.to_string());
            at = n.parent;
            if out.len() > self.nodes.len() {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_share_their_callers_and_read_back_innermost_first() {
        let main: Arc<str> = "a.py(9): <module>".into();
        let f: Arc<str> = "a.py(3): f".into();
        let g: Arc<str> = "a.py(5): g".into();
        let mut trie = FrameTrie::default();
        let in_f = trie.intern(&[f.clone(), main.clone()]).unwrap();
        let in_g = trie.intern(&[g.clone(), main.clone()]).unwrap();
        assert_ne!(in_f, in_g);
        assert_eq!(trie.intern(&[f.clone(), main.clone()]), Some(in_f));
        assert_eq!(trie.nodes.len(), 3, "<module> is stored once");
        assert_eq!(trie.path(in_g), ["a.py(5): g", "a.py(9): <module>"]);
        assert_eq!(trie.intern(&[]), None);
        assert!(trie.path(ROOT).is_empty());
    }

    fn raw(code: u64, offset: i32) -> RenderKey {
        RenderKey {
            code,
            offset,
            ident: 77,
        }
    }

    #[test]
    fn a_path_seen_before_is_found_whole_after_other_paths() {
        let calls = std::cell::Cell::new(0);
        let text_of = |k: &RenderKey| -> Arc<str> {
            calls.set(calls.get() + 1);
            format!("a.py({}): f{}", k.offset, k.code).into()
        };
        let mut trie = FrameTrie::default();
        let deep: Vec<RenderKey> = (0..20).map(|i| raw(100 + i, 2 * i as i32)).collect();
        let node = trie.intern_raw(&deep, text_of).unwrap();
        // Paths whose outermost frames differ (a stack cut at another depth) in between.
        for shift in 1..5 {
            let other: Vec<RenderKey> = (shift..20 + shift)
                .map(|i| raw(100 + i, 2 * i as i32))
                .collect();
            trie.intern_raw(&other, text_of).unwrap();
        }
        let made = calls.get();
        assert_eq!(trie.intern_raw(&deep, text_of), Some(node));
        assert_eq!(calls.get(), made, "found without a text made");
        assert_eq!(trie.path(node).len(), 20);
        assert_eq!(trie.path(node)[0], "a.py(0): f100");
    }

    #[test]
    fn raw_frames_are_made_text_once_per_caller_and_share_text_nodes() {
        let texts: [Arc<str>; 3] = [
            "a.py(9): <module>".into(),
            "a.py(3): f".into(),
            "a.py(4): f".into(),
        ];
        let mut rendered = Vec::new();
        let mut text_of = |k: &RenderKey| {
            rendered.push((k.code, k.offset));
            // Offsets 6 and 8 of code 2 are one line (3); 12 is line 4.
            match (k.code, k.offset) {
                (1, _) => texts[0].clone(),
                (2, 12) => texts[2].clone(),
                _ => texts[1].clone(),
            }
        };
        let mut trie = FrameTrie::default();
        let first = trie
            .intern_raw(&[raw(2, 6), raw(1, 40)], &mut text_of)
            .unwrap();
        // Another instruction of the same line: the same node, its text made once more.
        let same_line = trie
            .intern_raw(&[raw(2, 8), raw(1, 40)], &mut text_of)
            .unwrap();
        assert_eq!(first, same_line);
        assert_eq!(
            trie.intern_raw(&[raw(2, 6), raw(1, 40)], &mut text_of),
            Some(first)
        );
        let other_line = trie
            .intern_raw(&[raw(2, 12), raw(1, 40)], &mut text_of)
            .unwrap();
        assert_ne!(first, other_line);
        // A code object at a freed one's address with other names is another frame.
        let mut moved = raw(2, 6);
        moved.ident = 78;
        trie.intern_raw(&[moved, raw(1, 40)], &mut text_of).unwrap();
        assert_eq!(trie.intern_raw(&[], &mut text_of), None);
        assert_eq!(rendered, [(1, 40), (2, 6), (2, 8), (2, 12), (2, 6)]);
        assert_eq!(trie.path(other_line), ["a.py(4): f", "a.py(9): <module>"]);
        assert_eq!(trie.nodes.len(), 3);
    }
}

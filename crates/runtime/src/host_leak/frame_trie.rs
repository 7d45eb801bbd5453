//! Python call paths as text, stored once per distinct prefix. A site keeps one node id: the
//! node of its innermost frame, whose parents are its callers. The stacks of a Python program
//! share their outer frames (the import machinery's, a training loop's callers), so a path of
//! twenty frames costs one node where it differs from every path seen before, not twenty text
//! pointers per site.

use std::collections::HashMap;
use std::sync::Arc;

use crate::hashing::FastHash;

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
    /// (parent, text pointer) -> node. Equal texts are one `Arc` (`python::render_shared`), so
    /// the pointer stands for the text while the node holds it.
    children: HashMap<(u32, usize), u32, FastHash>,
}

impl FrameTrie {
    /// The node of the path `frames` (innermost first); `None` for an empty path, or when the
    /// trie holds `u32::MAX - 1` nodes already.
    pub fn intern(&mut self, frames: &[Arc<str>]) -> Option<u32> {
        let mut node = ROOT;
        for text in frames.iter().rev() {
            let key = (node, Arc::as_ptr(text) as *const u8 as usize);
            node = match self.children.get(&key) {
                Some(&child) => child,
                None => {
                    let id = u32::try_from(self.nodes.len())
                        .ok()
                        .filter(|&id| id < ROOT)?;
                    self.nodes.push(Node {
                        parent: node,
                        text: text.clone(),
                    });
                    self.children.insert(key, id);
                    id
                }
            };
        }
        (node != ROOT).then_some(node)
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
}

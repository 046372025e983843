//! The ephemeral image store.
//!
//! Images tools return are kept here, in memory only, and history holds an
//! [`ImageRef`] to them. Nothing here reaches the journal, the attempts
//! ledger or an export. The store is bounded: past its byte budget the
//! oldest images go first, and after a restart it is empty; an image that
//! is gone is shown to the model as a placeholder saying so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keel_protocol::ImageRef;
use keel_protocol::ids::new_id;
use keel_provider::ImageData;
use keel_tools::ToolImage;

/// The default byte budget of the store.
pub const DEFAULT_BUDGET: usize = 256 * 1024 * 1024;

struct Entry {
    session_id: String,
    image: ImageData,
}

#[derive(Default)]
struct Inner {
    images: HashMap<String, Entry>,
    order: VecDeque<String>,
    bytes: usize,
}

/// Images by id, oldest evicted first.
pub struct ImageStore {
    budget: usize,
    inner: Mutex<Inner>,
}

impl ImageStore {
    pub fn new(budget: usize) -> ImageStore {
        ImageStore { budget, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `image` for `session_id` and returns its reference.
    pub fn put(&self, session_id: &str, image: ToolImage) -> ImageRef {
        let id = new_id("img");
        let reference = ImageRef { id: id.clone(), mime_type: image.mime_type.clone(), bytes: image.data.len() as u64 };
        let data = ImageData { mime_type: image.mime_type, data: Arc::from(image.data) };
        let mut inner = self.lock();
        inner.bytes += data.data.len();
        inner.images.insert(id.clone(), Entry { session_id: session_id.to_string(), image: data });
        inner.order.push_back(id);
        while inner.bytes > self.budget {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(entry) = inner.images.remove(&oldest) {
                inner.bytes -= entry.image.data.len();
            }
        }
        reference
    }

    /// The image `id` if it is still held for `session_id`.
    pub fn get(&self, session_id: &str, id: &str) -> Option<ImageData> {
        self.lock().images.get(id).filter(|e| e.session_id == session_id).map(|e| e.image.clone())
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

impl Default for ImageStore {
    fn default() -> ImageStore {
        ImageStore::new(DEFAULT_BUDGET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(n: usize) -> ToolImage {
        ToolImage { mime_type: "image/png".into(), data: vec![7; n] }
    }

    #[test]
    fn images_are_per_session_and_the_oldest_go_past_the_budget() {
        let store = ImageStore::new(100);
        let a = store.put("s1", image(60));
        assert_eq!(a.bytes, 60);
        assert!(store.get("s1", &a.id).is_some());
        assert!(store.get("s2", &a.id).is_none(), "another session cannot see it");
        let b = store.put("s1", image(60));
        assert!(store.get("s1", &a.id).is_none(), "evicted");
        assert_eq!(store.get("s1", &b.id).map(|i| i.data.len()), Some(60));
        assert_eq!(store.bytes(), 60);
    }
}

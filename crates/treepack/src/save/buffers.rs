//! What a save keeps or frees beside its work: the text buffer of the walks that write manifest
//! text (kept for the next walk), and big trees freed on another thread once written.

use crate::format::manifest::FragmentWriter;
use std::sync::Mutex;

/// Trees with at least this many leaves are freed on a background thread once written.
pub const BACKGROUND_DROP_LEAVES: usize = 10_000;

/// Free `v` on a short-lived thread: dropping a tree of 100k leaves takes milliseconds that a
/// caller who is done with it should not wait for. Falls back to dropping here if no thread
/// can be started.
pub fn drop_in_background<T: Send + 'static>(v: T) {
    let _ = std::thread::Builder::new().name("treepack-drop".into()).spawn(move || drop(v));
}

/// The most a kept text buffer may hold (bigger ones are freed): a 1M-leaf tree of scalars' text.
const SPARE_MAX: usize = 32 << 20;
/// Buffers below this size are not worth keeping (their allocator reuses them anyway).
const SPARE_MIN: usize = 1 << 20;

/// The text buffer kept for the next [`fragment_writer`]: one per process, of at most
/// [`SPARE_MAX`] bytes (the memory a loop of saves uses anyway). Saves of scalar trees in a
/// loop (a metrics log) write megabytes of text each time; a fresh buffer that size is a fresh
/// mapping whose pages the kernel faults in and zeroes on first touch.
static SPARE: Mutex<String> = Mutex::new(String::new());

/// The kept buffer (empty), or a new one. Never waits: a lock held elsewhere (another save's
/// drop thread, or a parent's thread at the moment a child was forked, whose lock nobody in
/// the child will ever release) only means a new buffer.
fn take_spare() -> String {
    let mut s = SPARE.try_lock().map(|mut g| std::mem::take(&mut *g)).unwrap_or_default();
    s.clear();
    s
}

/// Keep `s` for the next writer if it is a size worth keeping and bigger than the one kept
/// (never waiting, as [`take_spare`]): the [`Recycle`](crate::format::manifest::Recycle) hook
/// of the writers [`fragment_writer`] makes.
fn keep_spare(s: String) {
    if (SPARE_MIN..=SPARE_MAX).contains(&s.capacity()) {
        if let Ok(mut g) = SPARE.try_lock() {
            if g.capacity() < s.capacity() {
                *g = s;
            }
        }
    }
}

/// A [`FragmentWriter`] with room for `bytes` of text, writing into the buffer this process
/// kept from an earlier writer, and keeping its own once its text is dropped: a walk that
/// writes a big text save after save touches no fresh pages.
pub fn fragment_writer(bytes: usize) -> FragmentWriter {
    let mut buf = take_spare();
    buf.reserve(bytes);
    FragmentWriter::with_buffer(buf, Some(keep_spare))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A big writer's buffer, once its fragment (and the bytes lent from it) are dropped, is
    /// the next writer's: no fresh pages to fault in; and a child forked while another thread
    /// held the spare's lock writes without waiting for it. (The only test that takes the
    /// spare: `fragment_writer` callers are the only takers.)
    #[test]
    fn a_dropped_text_buffer_serves_the_next_writer() {
        let mut w = fragment_writer(3 << 20);
        let start = w.mark();
        w.list_begin();
        w.int(0);
        for i in 1..200_000 {
            w.comma();
            w.int(i);
        }
        w.list_end();
        let f = w.split_off(start);
        let bytes = f.bytes();
        let at = f.text().as_ptr();
        drop(f);
        // Still lent out as bytes: not kept yet.
        assert_eq!(bytes.as_ptr(), at);
        drop(bytes);
        drop(w);
        let next = take_spare();
        assert!(next.capacity() >= 3 << 20, "{}", next.capacity());
        assert!(next.is_empty());
        keep_spare(next);
        // Beyond the bound, nothing is kept.
        keep_spare(String::with_capacity(SPARE_MAX + 1));
        assert!(SPARE.lock().map(|g| g.capacity() <= SPARE_MAX).unwrap_or(false));
        #[cfg(unix)]
        {
            let held = SPARE.lock();
            // SAFETY: the child only writes text and leaves with `_exit` (no destructors).
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let mut w = fragment_writer(2 << 20);
                let start = w.mark();
                w.int(1);
                let f = w.split_off(start);
                let ok = f.text() == "1";
                drop(f);
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            drop(held);
            let status = crate::runtime::wait_for_child(pid, "the forked child waited for the spare buffer's lock");
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: status {status}");
        }
    }
}

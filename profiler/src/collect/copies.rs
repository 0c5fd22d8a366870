//! Samples whose user stack came as a copy (`flags::STACK_COPY`: taken before their
//! process's tables were in the kernel), between the ring buffer and the collection: the
//! collector walks each copy with `unwind::CopyUnwinder`, keeping a record whose tables are
//! still compiling until they are, and a window's end waits a while for them (reading the
//! ring meanwhile, `hold`).
use aya::maps::{MapData, RingBuf};

use super::Collection;

impl Collection {
    /// Walks the stack copies samples carry with `unwinder` (see `unwind::copied`).
    pub(crate) fn with_copy_unwinder(mut self, unwinder: crate::unwind::CopyUnwinder) -> Self {
        self.copies = Some(unwinder);
        self
    }

    /// Reads the ring's sample records without adding them: they are taken after the window
    /// being ended, which waits (for the tables of its stack copies, `Session::settle`), and
    /// go to the next one at its first `drain`. Meanwhile the ring keeps room: left unread
    /// through a wait of seconds it filled, and samples were lost.
    pub(crate) fn hold(&mut self, ring: &mut RingBuf<MapData>) {
        self.held.read(ring);
    }

    /// Adds the records that waited for their stack copy's tables (`unwind::copied`): those
    /// whose tables are ready, or all of them when `force` (walked with what there is).
    pub(crate) fn add_deferred(&mut self, force: bool) {
        let Some(unwinder) = self.copies.as_mut() else {
            return;
        };
        let records = unwinder.take_ready(force);
        for (record, mappings) in records {
            if let Some(u) = self.copies.as_mut() {
                u.retake(mappings);
            }
            self.add(&record);
        }
        if let Some(u) = self.copies.as_mut() {
            u.done_forcing();
        }
    }

    /// Whether records wait for stack-copy tables still being compiled.
    pub(crate) fn copies_waiting(&self) -> bool {
        self.copies
            .as_ref()
            .is_some_and(crate::unwind::CopyUnwinder::waiting)
    }
}

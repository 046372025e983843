//! Run archives (see docs/archive.md): `keel export` turns a session's
//! journal into one, `keel import` loads one into another state directory,
//! and `keel show --at` / `keel replay` read them.
//!
//! How keel maps its journal onto the format: the checkpoint is the session
//! as `session_created` recorded it (seq 1, empty history); then one `diff`
//! per journal event, carrying what it changed and the event's own data, so
//! an importer rebuilds the journal seq for seq; `ownership_changed` events
//! become `ownership` records. A turn's end also withdraws its unanswered
//! questions, which has no event of its own: that is a second diff at the
//! same seq without `data` (a derived record, not a journal event).

mod export;
mod import;

pub(crate) use export::all_events;
pub use export::{archive_records, journal_events};
pub use keel_archive::{Archive, ArchiveWriter, Record, RunState};

use keel_protocol::session::Owner;

/// keel's owner type in the archive's.
pub(crate) fn to_archive_owner(owner: &Owner) -> keel_archive::Owner {
    keel_archive::Owner {
        machine_id: owner.machine_id.clone(),
        process_id: owner.process_id,
        instance_id: owner.instance_id.clone(),
    }
}

/// The archive's owner type in keel's.
pub(crate) fn from_archive_owner(owner: &keel_archive::Owner) -> Owner {
    Owner { machine_id: owner.machine_id.clone(), process_id: owner.process_id, instance_id: owner.instance_id.clone() }
}

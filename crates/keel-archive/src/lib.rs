//! The portable run archive: one file that carries a session's journaled
//! state from one keel state directory to another (`keel export`,
//! `keel import`).
//!
//! An archive is a preamble, then checksummed frames of JSON [`Record`]s: a
//! [`Header`], a full [`Checkpoint`] of the run, then one [`Diff`] per
//! journal event and an [`Ownership`] record whenever another keel process
//! took the run over. [`Archive`] reads one back (keeping every good frame
//! of a file whose tail was torn by a crash), folds it into the latest
//! [`RunState`] or materialises the state at any earlier journal seq.
//! [`ArchiveWriter`] writes one atomically. The byte layout is specified in
//! `docs/archive.md`.
//!
//! Architecture invariant: this crate is pure and synchronous. It never
//! sees a secret or image bytes: the wire types carry none, and the writer
//! refuses a record that smuggles a base64 image in anyway.

mod error;
mod frame;
mod reader;
mod record;
mod state;
mod writer;

pub use error::{Error, Result};
pub use frame::{FORMAT_VERSION, MAGIC, MAX_FRAME_LEN, write_frame, write_preamble};
pub use reader::{Archive, TornTail};
pub use record::{Checkpoint, Diff, Header, Owner, Ownership, Record, TurnChange};
pub use state::{RunState, TurnSummary};
pub use writer::ArchiveWriter;

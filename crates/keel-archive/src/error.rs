//! The one error type of the crate: every way reading, writing or folding
//! an archive can fail, each message saying what happened and what to do.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("could not {action} {}: {source}; check the path, its permissions and free space", path.display())]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    /// Writing a frame to a caller's writer failed.
    #[error("could not write an archive frame: {0}; check that the destination is writable and has room")]
    Write(#[source] std::io::Error),
    /// The bytes do not start with the archive magic.
    #[error("not a keel archive ({reason}); pass a file written by `keel export`")]
    NotAnArchive { reason: String },
    /// The archive was written by a newer keel.
    #[error(
        "archive format version {found} is newer than the version {supported} this keel reads; upgrade keel to import it"
    )]
    UnsupportedVersion { found: u16, supported: u16 },
    /// The preamble sets flags this version does not define.
    #[error(
        "archive flags {flags:#06x} are unknown to this keel (format version 1 defines none); upgrade keel to import it"
    )]
    UnknownFlags { flags: u16 },
    /// The header frame is missing, torn or not a header.
    #[error(
        "the archive has no readable header ({reason}); nothing can be recovered from it, export the session again"
    )]
    MissingHeader { reason: String },
    /// A frame before the last one fails its checksum or does not decode.
    #[error(
        "archive frame at byte offset {offset} is corrupt ({reason}); the archive cannot be trusted past it, export the session again"
    )]
    Corrupt { offset: u64, reason: String },
    /// A record could not be encoded as JSON.
    #[error("could not encode a {kind} record: {source}; this is a bug in keel, please report it")]
    Encode { kind: &'static str, source: serde_json::Error },
    /// An encoded record is larger than a frame may be.
    #[error(
        "a {kind} record encodes to {len} bytes, more than the {max} byte frame limit; write a checkpoint in smaller pieces or report it"
    )]
    FrameTooLarge { kind: &'static str, len: usize, max: u32 },
    /// A record carries a base64 image, which an archive never holds.
    #[error(
        "refused to write a {kind} record holding a base64 `data:image/` URL; images go into history as references, find where the bytes leaked in"
    )]
    ImageData { kind: &'static str },
    /// A header was appended after the first frame.
    #[error(
        "an archive has exactly one header, written by ArchiveWriter::create; append checkpoints, diffs and ownership records only"
    )]
    SecondHeader,
    /// A diff appends a history item at an index that is not the next one.
    #[error(
        "diff at seq {seq} appends history item {found} but the next index is {expected}; the archive is missing or repeating items, export it again"
    )]
    IndexGap { seq: u64, expected: u64, found: u64 },
    /// A record's seq is before the state's seq.
    #[error("record at seq {seq} comes after the state at seq {state_seq}; records must be applied in journal order")]
    OutOfOrder { seq: u64, state_seq: u64 },
    /// A header or checkpoint was passed to `RunState::apply`.
    #[error("a {kind} record cannot be applied to a state; start a state with RunState::from_checkpoint instead")]
    NotApplicable { kind: &'static str },
    /// The archive holds no checkpoint to start from.
    #[error("the archive has no checkpoint, so no state can be built from it; export the session again")]
    NoCheckpoint,
    /// The seq asked for is not a point of the archive.
    #[error("seq {seq} is not a point of this archive ({nearest}); pick one of Archive::points")]
    NoSuchPoint { seq: u64, nearest: String },
}

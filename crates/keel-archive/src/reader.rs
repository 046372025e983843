//! Reading an archive back: [`Archive`] holds its decoded records, and
//! folds or materialises them into a [`RunState`].

use std::path::Path;

use crate::error::{Error, Result};
use crate::frame::{FrameRead, check_preamble, read_frame};
use crate::record::{Header, Owner, Record};
use crate::state::RunState;

/// A decoded archive.
#[derive(Debug, Clone, PartialEq)]
pub struct Archive {
    pub header: Header,
    /// Every frame after the header, in file order.
    pub records: Vec<Record>,
    /// Set when the file ends in an incomplete frame (a crash mid-write);
    /// every frame before it is in `records`.
    pub torn_tail: Option<TornTail>,
}

/// Where an archive's good frames end and why the bytes after are dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// Byte offset of the first dropped byte (the end of the last good frame).
    pub offset: u64,
    pub reason: String,
}

impl Archive {
    /// Reads and decodes the archive at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Archive> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io { action: "read", path: path.into(), source })?;
        Archive::from_bytes(&bytes)
    }

    /// Decodes an archive held in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Archive> {
        let mut pos = check_preamble(bytes)?;
        let header = match read_frame(bytes, pos)? {
            FrameRead::Record { record: Record::Header(header), end } => {
                pos = end;
                header
            }
            FrameRead::Record { record, .. } => {
                return Err(Error::MissingHeader { reason: format!("the first frame is a {} record", record.kind()) });
            }
            FrameRead::End => return Err(Error::MissingHeader { reason: "the file ends after the preamble".into() }),
            FrameRead::Torn(torn) => return Err(Error::MissingHeader { reason: torn.reason }),
        };
        let mut records = Vec::new();
        let mut torn_tail = None;
        loop {
            match read_frame(bytes, pos)? {
                FrameRead::Record { record: Record::Header(_), .. } => {
                    return Err(Error::Corrupt { offset: pos as u64, reason: "a second header frame".into() });
                }
                FrameRead::Record { record, end } => {
                    records.push(record);
                    pos = end;
                }
                FrameRead::End => break,
                FrameRead::Torn(torn) => {
                    torn_tail = Some(torn);
                    break;
                }
            }
        }
        Ok(Archive { header, records, torn_tail })
    }

    /// The latest state: the last checkpoint with every later record applied.
    pub fn fold(&self) -> Result<RunState> {
        let start = self.records.iter().rposition(|r| matches!(r, Record::Checkpoint(_))).ok_or(Error::NoCheckpoint)?;
        self.replay(start, u64::MAX)
    }

    /// Every seq [`Archive::materialize`] accepts, ascending: checkpoint
    /// seqs, and diff and ownership seqs after the first checkpoint.
    pub fn points(&self) -> Vec<u64> {
        let first = self.records.iter().position(|r| matches!(r, Record::Checkpoint(_))).unwrap_or(self.records.len());
        let mut points: Vec<u64> = self.records.iter().skip(first).filter_map(Record::seq).collect();
        points.sort_unstable();
        points.dedup();
        points
    }

    /// The state exactly at `seq`: the latest checkpoint at or before it,
    /// then every record up to and including `seq`.
    pub fn materialize(&self, seq: u64) -> Result<RunState> {
        let points = self.points();
        if points.binary_search(&seq).is_err() {
            return Err(Error::NoSuchPoint { seq, nearest: nearest(&points, seq) });
        }
        let start = self
            .records
            .iter()
            .rposition(|r| matches!(r, Record::Checkpoint(c) if c.seq <= seq))
            .ok_or(Error::NoCheckpoint)?;
        self.replay(start, seq)
    }

    /// The writer of the archive, then each process that took the run over.
    pub fn owners(&self) -> Vec<Owner> {
        let changes = self.records.iter().filter_map(|r| match r {
            Record::Ownership(change) => Some(change.to.clone()),
            _ => None,
        });
        std::iter::once(self.header.owner()).chain(changes).collect()
    }

    /// Starts from the checkpoint at `records[start]` and applies the
    /// diffs and ownership records after it, up to and including `until`.
    fn replay(&self, start: usize, until: u64) -> Result<RunState> {
        let Some(Record::Checkpoint(checkpoint)) = self.records.get(start) else {
            return Err(Error::NoCheckpoint);
        };
        let mut state = RunState::from_checkpoint(checkpoint);
        for record in self.records.iter().skip(start + 1) {
            match record {
                Record::Checkpoint(c) if c.seq > until => break,
                Record::Checkpoint(_) | Record::Header(_) => {}
                Record::Diff(_) | Record::Ownership(_) => {
                    if record.seq().is_some_and(|seq| seq > until) {
                        break;
                    }
                    state.apply(record)?;
                }
            }
        }
        Ok(state)
    }
}

/// "the nearest are 4 and 7" for an error message.
fn nearest(points: &[u64], seq: u64) -> String {
    let below = points.iter().rev().find(|p| **p < seq);
    let above = points.iter().find(|p| **p > seq);
    match (below, above) {
        (Some(b), Some(a)) => format!("the nearest are {b} and {a}"),
        (Some(b), None) => format!("the last is {b}"),
        (None, Some(a)) => format!("the first is {a}"),
        (None, None) => "it has no points".into(),
    }
}

//! The byte layout: a 12-byte preamble, then frames of
//! `u32 LE length | u32 LE CRC-32 | JSON payload`.
//!
//! Decoding a frame tells a torn tail (what a crash mid-write leaves: the
//! last bytes missing) from corruption (bytes changed before the end); see
//! `docs/archive.md` for the rule.

use std::io::Write;

use crate::error::{Error, Result};
use crate::reader::TornTail;
use crate::record::Record;

/// The first eight bytes of every archive.
pub const MAGIC: &[u8; 8] = b"KEELARCH";
/// The format version this crate writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// The largest frame payload, in bytes (64 MiB).
pub const MAX_FRAME_LEN: u32 = 64 << 20;

pub(crate) const PREAMBLE_LEN: usize = 12;
const FRAME_HEADER_LEN: usize = 8;

/// Writes the preamble: magic, format version, flags (none).
pub fn write_preamble<W: Write + ?Sized>(w: &mut W) -> Result<()> {
    let mut preamble = [0u8; PREAMBLE_LEN];
    preamble[..8].copy_from_slice(MAGIC);
    preamble[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    w.write_all(&preamble).map_err(Error::Write)
}

/// Writes one record as a frame. Refuses a record holding a base64 image or
/// larger than [`MAX_FRAME_LEN`]; nothing is written then.
pub fn write_frame<W: Write + ?Sized>(w: &mut W, record: &Record) -> Result<()> {
    let frame = encode_frame(record)?;
    w.write_all(&frame).map_err(Error::Write)
}

/// The whole frame, header and payload, in one buffer.
pub(crate) fn encode_frame(record: &Record) -> Result<Vec<u8>> {
    let kind = record.kind();
    let mut frame = vec![0u8; FRAME_HEADER_LEN];
    serde_json::to_writer(&mut frame, record).map_err(|source| Error::Encode { kind, source })?;
    let payload = frame.get(FRAME_HEADER_LEN..).unwrap_or_default();
    if carries_image_data(payload) {
        return Err(Error::ImageData { kind });
    }
    let len = u32::try_from(payload.len()).ok().filter(|len| *len <= MAX_FRAME_LEN).ok_or(Error::FrameTooLarge {
        kind,
        len: payload.len(),
        max: MAX_FRAME_LEN,
    })?;
    let crc = crc32fast::hash(payload);
    frame[..4].copy_from_slice(&len.to_le_bytes());
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// Whether the JSON holds a base64 `data:image/...;base64,` URL. A cheap
/// scan, not a parse: defence in depth behind the types, which carry none.
fn carries_image_data(json: &[u8]) -> bool {
    const PREFIX: &[u8] = b"data:image/";
    const MARKER: &[u8] = b";base64,";
    json.windows(PREFIX.len()).enumerate().filter(|(_, w)| *w == PREFIX).any(|(at, _)| {
        let rest = json.get(at + PREFIX.len()..).unwrap_or_default();
        let window = rest.get(..rest.len().min(64)).unwrap_or_default();
        window.windows(MARKER.len()).any(|w| w == MARKER)
    })
}

/// Checks the preamble; returns where the first frame starts.
pub(crate) fn check_preamble(bytes: &[u8]) -> Result<usize> {
    let Some(preamble) = bytes.get(..PREAMBLE_LEN) else {
        let reason = format!("{} bytes, shorter than the 12-byte preamble", bytes.len());
        return Err(if bytes.starts_with(MAGIC) || MAGIC.starts_with(bytes) {
            Error::MissingHeader { reason }
        } else {
            Error::NotAnArchive { reason }
        });
    };
    if &preamble[..8] != MAGIC {
        return Err(Error::NotAnArchive { reason: "the file does not start with KEELARCH".into() });
    }
    let version = u16::from_le_bytes([preamble[8], preamble[9]]);
    if version == 0 {
        return Err(Error::NotAnArchive { reason: "format version 0 does not exist".into() });
    }
    if version > FORMAT_VERSION {
        return Err(Error::UnsupportedVersion { found: version, supported: FORMAT_VERSION });
    }
    let flags = u16::from_le_bytes([preamble[10], preamble[11]]);
    if flags != 0 {
        return Err(Error::UnknownFlags { flags });
    }
    Ok(PREAMBLE_LEN)
}

/// What the bytes at one offset hold.
pub(crate) enum FrameRead {
    Record { record: Record, end: usize },
    End,
    Torn(TornTail),
}

/// Decodes the frame starting at `pos`.
pub(crate) fn read_frame(bytes: &[u8], pos: usize) -> Result<FrameRead> {
    let rest = bytes.get(pos..).unwrap_or_default();
    let offset = pos as u64;
    let torn = |reason: String| Ok(FrameRead::Torn(TornTail { offset, reason }));
    if rest.is_empty() {
        return Ok(FrameRead::End);
    }
    // A crash can leave a preallocated tail of zeros; a frame is never zeros.
    if rest.iter().all(|b| *b == 0) {
        return torn(format!("{} zero bytes after the last frame", rest.len()));
    }
    let Some(frame_header) = rest.get(..FRAME_HEADER_LEN) else {
        return torn(format!("{} bytes after the last frame, too short for a frame header", rest.len()));
    };
    let len = u32::from_le_bytes([frame_header[0], frame_header[1], frame_header[2], frame_header[3]]);
    let crc = u32::from_le_bytes([frame_header[4], frame_header[5], frame_header[6], frame_header[7]]);
    if len > MAX_FRAME_LEN {
        let reason = format!("it declares {len} bytes, more than the {MAX_FRAME_LEN} byte limit");
        return Err(Error::Corrupt { offset, reason });
    }
    let end = FRAME_HEADER_LEN + len as usize;
    let Some(payload) = rest.get(FRAME_HEADER_LEN..end) else {
        let remain = rest.len() - FRAME_HEADER_LEN;
        return torn(format!("the last frame declares {len} bytes but only {remain} remain"));
    };
    let is_last = end == rest.len();
    let failed = |reason: String| {
        if is_last {
            torn(format!("the last frame is incomplete: {reason}"))
        } else {
            Err(Error::Corrupt { offset, reason })
        }
    };
    if crc32fast::hash(payload) != crc {
        return failed("its checksum does not match".into());
    }
    match serde_json::from_slice::<Record>(payload) {
        Ok(record) => Ok(FrameRead::Record { record, end: pos + end }),
        Err(e) => failed(format!("its JSON does not decode: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_guard_needs_a_base64_data_url() {
        assert!(carries_image_data(br#"{"text":"data:image/png;base64,iVBORw0KGgo="}"#));
        assert!(!carries_image_data(br#"{"text":"the page uses data:image/ URLs"}"#));
        assert!(!carries_image_data(br#"{"mime_type":"image/png"}"#));
    }

    #[test]
    fn short_inputs_are_told_apart() {
        assert!(matches!(check_preamble(b"KEEL"), Err(Error::MissingHeader { .. })));
        assert!(matches!(check_preamble(b"PK\x03\x04"), Err(Error::NotAnArchive { .. })));
        assert!(matches!(check_preamble(b"KEELARCH\x01\x00\x01\x00"), Err(Error::UnknownFlags { flags: 1 })));
    }
}

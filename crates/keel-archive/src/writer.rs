//! [`ArchiveWriter`]: writes a new archive atomically, or appends frames to
//! an existing one.
//!
//! A new archive is written to a temporary file beside its final name and
//! renamed into place by `finish`, so a crashed export never leaves a half
//! file under that name (at worst a `.*.partial` file beside it).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::frame::{encode_frame, write_preamble};
use crate::reader::Archive;
use crate::record::{Header, Record};

/// Writes archive frames to a file.
pub struct ArchiveWriter {
    file: BufWriter<File>,
    /// The archive's final name.
    path: PathBuf,
    /// The temporary file being written, for a new archive; `None` when
    /// appending in place or once renamed.
    temp: Option<PathBuf>,
}

impl ArchiveWriter {
    /// Starts a new archive that will appear at `path` on
    /// [`finish`](Self::finish): writes the preamble and the header frame.
    pub fn create(path: impl AsRef<Path>, header: &Header) -> Result<ArchiveWriter> {
        let path = path.as_ref().to_path_buf();
        let temp = temp_path(&path);
        let file = OpenOptions::new().write(true).create_new(true).open(&temp).map_err(|source| Error::Io {
            action: "create",
            path: temp.clone(),
            source,
        })?;
        let mut writer = ArchiveWriter { file: BufWriter::new(file), path, temp: Some(temp) };
        write_preamble(&mut writer.file).map_err(|e| writer.io_context(e))?;
        writer.write(&Record::Header(header.clone()))?;
        Ok(writer)
    }

    /// Opens an existing archive to append more frames, first cutting off
    /// a torn tail if it has one. Frames are written in place; call
    /// [`finish`](Self::finish) to make them durable.
    pub fn append_to(path: impl AsRef<Path>) -> Result<ArchiveWriter> {
        let path = path.as_ref().to_path_buf();
        let io = |action, source| Error::Io { action, path: path.clone(), source };
        let bytes = std::fs::read(&path).map_err(|e| io("read", e))?;
        let archive = Archive::from_bytes(&bytes)?;
        let file = OpenOptions::new().append(true).open(&path).map_err(|e| io("open", e))?;
        if let Some(torn) = &archive.torn_tail {
            file.set_len(torn.offset).map_err(|e| io("truncate the torn tail of", e))?;
            file.sync_all().map_err(|e| io("sync", e))?;
        }
        Ok(ArchiveWriter { file: BufWriter::new(file), path, temp: None })
    }

    /// Appends one record. A header is refused (an archive has one), and so
    /// is a record holding a base64 image; nothing is written then.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        if matches!(record, Record::Header(_)) {
            return Err(Error::SecondHeader);
        }
        self.write(record)
    }

    /// Flushes and syncs the file, then (for a new archive) renames it into
    /// place and syncs its directory.
    pub fn finish(mut self) -> Result<()> {
        let written = self.temp.clone().unwrap_or_else(|| self.path.clone());
        let io = |action, source| Error::Io { action, path: written.clone(), source };
        self.file.flush().map_err(|e| io("write", e))?;
        self.file.get_ref().sync_all().map_err(|e| io("sync", e))?;
        if let Some(temp) = self.temp.take() {
            if let Err(source) = std::fs::rename(&temp, &self.path) {
                let _ = std::fs::remove_file(&temp);
                return Err(Error::Io { action: "rename the finished archive to", path: self.path.clone(), source });
            }
            sync_dir(&self.path)?;
        }
        Ok(())
    }

    fn write(&mut self, record: &Record) -> Result<()> {
        let frame = encode_frame(record)?;
        self.file.write_all(&frame).map_err(|source| self.io_context(Error::Write(source)))
    }

    /// Names the file in an I/O error from the frame encoder.
    fn io_context(&self, error: Error) -> Error {
        match error {
            Error::Write(source) => {
                let path = self.temp.clone().unwrap_or_else(|| self.path.clone());
                Error::Io { action: "write", path, source }
            }
            other => other,
        }
    }
}

impl Drop for ArchiveWriter {
    /// An unfinished new archive is removed, never left half-written.
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// `.<name>.<pid>.<nanos>.partial` in the same directory as `path`, so the
/// final rename stays on one file system.
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "archive".into());
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    path.with_file_name(format!(".{name}.{}.{nanos}.partial", std::process::id()))
}

/// Syncs the directory holding `path`, so the rename survives a crash.
fn sync_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(|source| Error::Io {
            action: "sync the directory",
            path: dir.into(),
            source,
        })?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

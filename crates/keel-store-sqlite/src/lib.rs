//! The SQLite backend of [`keel_store::Store`].
//!
//! # Durability and group commit
//!
//! The database runs in WAL mode with `synchronous = FULL`: a commit is on
//! disk (the WAL is fsynced) before it is acknowledged, so an acknowledged
//! submission survives power loss, not just a process crash. `NORMAL` would
//! be faster but can lose the last commits on power loss, which breaks the
//! promise that an acknowledged submission exists.
//!
//! To keep one fsync from costing one event, a single writer thread owns the
//! write connection. It takes every change waiting in its queue, runs each in
//! its own `SAVEPOINT` inside one transaction, and commits once. A change that
//! fails (a constraint, a trigger) rolls back to its savepoint alone; the
//! others still commit. Each caller's future resolves after the commit.
//!
//! Reads use a small pool of separate connections, which WAL lets run beside
//! the writer without blocking it.

mod migrations;
mod read;
mod write;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use keel_protocol::session::{AttemptInfo, SessionInfo, ToolCallInfo, TurnInfo};
use keel_protocol::{CompactionRecord, Event, InteractionInfo, Item, TurnStatus};
use keel_store::{Change, Result, Store, StoreError, StoreFuture};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

/// The database file's name inside a state directory.
pub const DATABASE_FILE: &str = "runtime.sqlite3";

/// Most changes committed in one transaction.
const MAX_BATCH: usize = 512;

struct WriteJob {
    change: Change,
    reply: oneshot::Sender<Result<Vec<Event>>>,
}

/// A SQLite-backed store. Cloning is cheap; the writer thread stops when the
/// last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: Option<Mutex<mpsc::Sender<WriteJob>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    readers: Mutex<Vec<Connection>>,
    read_only: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer loop after it drains its queue.
        self.writer.take();
        if let Ok(mut slot) = self.writer_thread.lock()
            && let Some(handle) = slot.take()
        {
            let _ = handle.join();
        }
    }
}

/// Makes the database owner-only (0600) whatever the umask: created empty
/// with that mode (an empty file is an empty SQLite database), or tightened
/// if it exists. SQLite gives its `-wal` and `-shm` files the database
/// file's mode; existing ones are tightened too. Failures are left to the
/// open that follows (a read-only state directory, say), which reports them.
fn owner_only(path: &Path) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if !path.exists() {
        let _ = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
        return;
    }
    for suffix in ["", "-wal", "-shm"] {
        let file = std::path::PathBuf::from(format!("{}{suffix}", path.display()));
        if let Ok(meta) = std::fs::metadata(&file)
            && meta.permissions().mode() & 0o077 != 0
        {
            let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600));
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database in `state_dir` and migrates it.
    pub fn open(state_dir: &Path) -> Result<SqliteStore> {
        let path = state_dir.join(DATABASE_FILE);
        let unusable = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
                StoreError::Backend(format!(
                    "the database {} is corrupt or not a keel database ({e}); keel left it untouched: restore it from a backup, or move it aside to start with an empty state",
                    path.display()
                ))
            }
            Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => StoreError::Backend(format!(
                "the database {} cannot be written ({e}); keel needs a writable state directory (is it on a read-only filesystem?)",
                path.display()
            )),
            _ => backend(e),
        };
        owner_only(&path);
        let mut conn = Connection::open(&path).map_err(unusable)?;
        configure(&conn).map_err(|e| match e {
            StoreError::Backend(message) if message.contains("not a database") || message.contains("malformed") => {
                StoreError::Backend(format!(
                    "the database {} is corrupt or not a keel database ({message}); keel left it untouched: restore it from a backup, or move it aside to start with an empty state",
                    path.display()
                ))
            }
            other => other,
        })?;
        migrations::migrate(&mut conn)?;
        let (tx, rx) = mpsc::channel::<WriteJob>();
        let handle = std::thread::Builder::new()
            .name("keel-store-writer".into())
            .spawn(move || write::writer_loop(conn, rx))
            .map_err(|e| StoreError::Backend(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: Some(Mutex::new(tx)),
                writer_thread: Mutex::new(Some(handle)),
                readers: Mutex::new(Vec::new()),
                read_only: false,
            }),
        })
    }

    /// Opens an existing database for reading only: no migrations, no
    /// writer. Safe beside a running keel that owns the state directory.
    pub fn open_read_only(state_dir: &Path) -> Result<SqliteStore> {
        let path = state_dir.join(DATABASE_FILE);
        if !path.exists() {
            return Err(StoreError::Backend(format!("no keel database at {}; check --state", path.display())));
        }
        let conn = open_reader(&path, true)?;
        migrations::check_version(&conn)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path,
                writer: None,
                writer_thread: Mutex::new(None),
                readers: Mutex::new(vec![conn]),
                read_only: true,
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on a reader connection in the blocking pool.
    fn read<T, F>(&self, f: F) -> StoreFuture<'_, T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let pooled = inner.readers.lock().ok().and_then(|mut pool| pool.pop());
                let conn = match pooled {
                    Some(conn) => conn,
                    None => open_reader(&inner.path, inner.read_only)?,
                };
                let result = f(&conn);
                if let Ok(mut pool) = inner.readers.lock()
                    && pool.len() < 4
                {
                    pool.push(conn);
                }
                result
            })
            .await
            .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
        })
    }
}

fn open_reader(path: &Path, read_only: bool) -> Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags).map_err(backend)?;
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(backend)?;
    Ok(conn)
}

fn configure(conn: &Connection) -> Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(backend)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(backend)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend(format!(
            "the database could not switch to WAL mode (it is in {mode} mode); is the state directory on a network filesystem?"
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;").map_err(backend)?;
    Ok(())
}

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(code, _) if matches!(code.code, rusqlite::ErrorCode::ConstraintViolation) => {
            StoreError::Rejected(e.to_string())
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

impl Store for SqliteStore {
    fn commit(&self, change: Change) -> StoreFuture<'_, Vec<Event>> {
        Box::pin(async move {
            let Some(writer) = &self.inner.writer else {
                return Err(StoreError::ReadOnly);
            };
            let (reply, wait) = oneshot::channel();
            writer
                .lock()
                .map_err(|_| StoreError::Closed)?
                .send(WriteJob { change, reply })
                .map_err(|_| StoreError::Closed)?;
            wait.await.map_err(|_| StoreError::Closed)?
        })
    }

    fn sessions(&self) -> StoreFuture<'_, Vec<SessionInfo>> {
        self.read(read::sessions)
    }

    fn session(&self, session_id: String) -> StoreFuture<'_, Option<SessionInfo>> {
        self.read(move |c| read::session(c, &session_id))
    }

    fn turn(&self, turn_id: String) -> StoreFuture<'_, Option<TurnInfo>> {
        self.read(move |c| read::turn(c, &turn_id))
    }

    fn current_turns(&self) -> StoreFuture<'_, Vec<TurnInfo>> {
        self.read(read::current_turns)
    }

    fn turns_with_status(&self, statuses: Vec<TurnStatus>) -> StoreFuture<'_, Vec<TurnInfo>> {
        self.read(move |c| read::turns_with_status(c, &statuses))
    }

    fn submission(&self, session_id: String, submission_id: String) -> StoreFuture<'_, Option<String>> {
        self.read(move |c| read::submission(c, &session_id, &submission_id))
    }

    fn history(&self, session_id: String, from: u64) -> StoreFuture<'_, Vec<Item>> {
        self.read(move |c| read::history(c, &session_id, from))
    }

    fn events(&self, session_id: String, after_seq: u64, limit: u32) -> StoreFuture<'_, Vec<Event>> {
        self.read(move |c| read::events(c, &session_id, after_seq, limit))
    }

    fn attempts(&self, session_id: String) -> StoreFuture<'_, Vec<AttemptInfo>> {
        self.read(move |c| read::attempts(c, &session_id))
    }

    fn tool_calls(&self, session_id: String, turn_id: Option<String>) -> StoreFuture<'_, Vec<ToolCallInfo>> {
        self.read(move |c| read::tool_calls(c, &session_id, turn_id.as_deref()))
    }

    fn last_seq(&self, session_id: String) -> StoreFuture<'_, u64> {
        self.read(move |c| read::last_seq(c, &session_id))
    }

    fn interactions(&self, session_id: Option<String>, pending_only: bool) -> StoreFuture<'_, Vec<InteractionInfo>> {
        self.read(move |c| read::interactions(c, session_id.as_deref(), pending_only))
    }

    fn compactions(&self, session_id: Option<String>, latest_only: bool) -> StoreFuture<'_, Vec<CompactionRecord>> {
        self.read(move |c| read::compactions(c, session_id.as_deref(), latest_only))
    }
}

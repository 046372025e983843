//! Reading a state directory without owning it.
//!
//! `keel sessions`, `keel show` and `keel events` work beside a running
//! `keel serve`: they open the database read-only, take no lock, and never
//! run recovery.

use std::path::Path;
use std::sync::Arc;

use keel_protocol::Event;
use keel_protocol::rpc::SessionSnapshot;
use keel_protocol::session::SessionInfo;
use keel_store::Store;
use keel_store_sqlite::SqliteStore;

use crate::error::{Result, RuntimeError};

/// A read-only view of a state directory.
#[derive(Clone)]
pub struct Inspector {
    store: Arc<dyn Store>,
}

impl Inspector {
    pub fn open(state_dir: &Path) -> Result<Inspector> {
        Ok(Inspector { store: Arc::new(SqliteStore::open_read_only(state_dir)?) })
    }

    pub async fn sessions(&self) -> Result<Vec<SessionInfo>> {
        Ok(self.store.sessions().await?)
    }

    /// Finds a session by id or by name (the newest with that name).
    pub async fn find(&self, id_or_name: &str) -> Result<SessionInfo> {
        if let Some(info) = self.store.session(id_or_name.to_string()).await? {
            return Ok(info);
        }
        let sessions = self.store.sessions().await?;
        sessions
            .into_iter()
            .rev()
            .find(|s| s.name == id_or_name)
            .ok_or_else(|| RuntimeError::NotFound { what: "session", id: id_or_name.to_string() })
    }

    pub async fn snapshot(&self, session_id: &str) -> Result<SessionSnapshot> {
        let info = self.find(session_id).await?;
        let turn = match &info.current_turn_id {
            Some(id) => self.store.turn(id.clone()).await?,
            None => None,
        };
        Ok(SessionSnapshot {
            history: self.store.history(info.id.clone(), 0).await?,
            attempts: self.store.attempts(info.id.clone()).await?,
            tool_calls: self.store.tool_calls(info.id.clone(), None).await?,
            last_seq: self.store.last_seq(info.id.clone()).await?,
            interactions: self
                .store
                .interactions(Some(info.id.clone()), false)
                .await?
                .iter()
                .filter_map(|i| serde_json::to_value(i).ok())
                .collect(),
            compaction: self.store.compactions(Some(info.id.clone()), true).await?.pop(),
            // Counting needs the session's model, which a read-only view
            // does not load.
            context: None,
            turn,
            session: info,
        })
    }

    /// A session as archive records (header, checkpoint, diffs): what
    /// `keel export` writes and `keel show --at` materialises.
    pub async fn archive(&self, session_id: &str) -> Result<keel_archive::Archive> {
        let info = self.find(session_id).await?;
        let mut records = crate::archive::archive_records(self.store.as_ref(), &info.id, env!("CARGO_PKG_VERSION"))
            .await?
            .into_iter();
        let Some(keel_archive::Record::Header(header)) = records.next() else {
            return Err(RuntimeError::Conflict("the archive has no header".into()));
        };
        Ok(keel_archive::Archive { header, records: records.collect(), torn_tail: None })
    }

    /// Writes a session's run archive to `path`. Returns how many records.
    pub async fn export(&self, session_id: &str, path: &Path) -> Result<usize> {
        let archive = self.archive(session_id).await?;
        let failed = |e: keel_archive::Error| RuntimeError::Config(format!("cannot write the archive: {e}"));
        let mut writer = keel_archive::ArchiveWriter::create(path, &archive.header).map_err(failed)?;
        for record in &archive.records {
            writer.append(record).map_err(failed)?;
        }
        writer.finish().map_err(failed)?;
        Ok(archive.records.len() + 1)
    }

    /// Every compaction record of a session, oldest first.
    pub async fn compactions(&self, session_id: &str) -> Result<Vec<keel_protocol::CompactionRecord>> {
        Ok(self.store.compactions(Some(session_id.to_string()), false).await?)
    }

    /// The whole journal of a session, in order.
    pub async fn all_events(&self, session_id: &str) -> Result<Vec<Event>> {
        crate::archive::all_events(self.store.as_ref(), session_id).await
    }

    pub async fn events(&self, session_id: &str, after_seq: u64, limit: u32) -> Result<Vec<Event>> {
        Ok(self.store.events(session_id.to_string(), after_seq, limit).await?)
    }
}

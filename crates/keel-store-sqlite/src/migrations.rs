//! Numbered schema migrations.
//!
//! Each migration runs once, in order, inside a transaction that also records
//! its number in `schema_migrations`. The SQL sticks to what PostgreSQL also
//! accepts (no `WITHOUT ROWID`, no SQLite-only types) so a PostgreSQL backend
//! can share the schema's shape.

use keel_store::{Result, StoreError};
use rusqlite::Connection;

use crate::backend;

const MIGRATIONS: &[(i64, &str)] = &[(1, V1), (2, V2), (3, V3), (4, V4), (5, V5), (6, V6)];

/// Which keel process last owned each session (run archives record hand-offs).
const V6: &str = "
ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT 'null';
";

/// Compaction records (outbound view boundaries); history is never
/// rewritten, so a record is all a compaction stores.
const V5: &str = "
CREATE TABLE compactions (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    number INTEGER NOT NULL,
    record TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    UNIQUE (session_id, number)
);
";

/// Sensitivity labels of history items (taint).
const V4: &str = "
ALTER TABLE sessions ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
";

/// A person's undelivered messages for a running turn (`turn/steer`).
const V3: &str = "
ALTER TABLE turns ADD COLUMN pending_steers TEXT NOT NULL DEFAULT '[]';
";

/// Provider attempts and output-limit continuations per turn.
const V2: &str = "
ALTER TABLE turns ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN continuations INTEGER NOT NULL DEFAULT 0;
";

const V1: &str = "
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    coworker TEXT NOT NULL,
    bundle_path TEXT NOT NULL,
    bundle_digest TEXT NOT NULL,
    coworker_spec TEXT NOT NULL,
    workspace TEXT NOT NULL,
    attended INTEGER NOT NULL,
    compaction TEXT NOT NULL,
    provider_blocked INTEGER NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    current_turn_id TEXT,
    history_len BIGINT NOT NULL DEFAULT 0,
    usage TEXT NOT NULL,
    last_seq BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE turns (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    submission_id TEXT NOT NULL,
    status TEXT NOT NULL,
    steps INTEGER NOT NULL,
    history_start BIGINT NOT NULL,
    error TEXT,
    usage TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
CREATE INDEX turns_by_session ON turns(session_id, created_at_ms);
CREATE INDEX turns_by_status ON turns(status);
CREATE TABLE submissions (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    submission_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, submission_id)
);
CREATE TABLE history (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    idx BIGINT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE model_attempts (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    turn_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    text TEXT NOT NULL,
    usage TEXT NOT NULL,
    finish_reason TEXT,
    error TEXT,
    started_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT
);
CREATE INDEX attempts_by_session ON model_attempts(session_id, started_at_ms);
CREATE TABLE tool_calls (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    call_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    name TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL,
    output TEXT,
    is_error INTEGER NOT NULL DEFAULT 0,
    started_at_ms BIGINT NOT NULL,
    finished_at_ms BIGINT,
    PRIMARY KEY (session_id, call_id)
);
CREATE TABLE interactions (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    turn_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    status TEXT NOT NULL,
    response TEXT,
    created_at_ms BIGINT NOT NULL,
    resolved_at_ms BIGINT
);
CREATE TABLE events (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
";

/// Applies every migration the database has not seen yet.
pub fn migrate(conn: &mut Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL)",
    )
    .map_err(backend)?;
    let current = current_version(conn)?;
    let newest = newest();
    if current > newest {
        return Err(StoreError::Backend(format!(
            "the database is at schema version {current}, newer than this keel understands ({newest}); upgrade keel"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        let tx = conn.transaction().map_err(backend)?;
        tx.execute_batch(sql).map_err(backend)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            (version, keel_protocol::ids::now_ms()),
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
    Ok(())
}

/// Fails unless the database is at exactly the schema this keel knows.
pub fn check_version(conn: &Connection) -> Result<()> {
    let current = current_version(conn)?;
    if current != newest() {
        return Err(StoreError::Backend(format!(
            "the database is at schema version {current}, this keel expects {}; open it once with `keel serve` to migrate, or upgrade keel",
            newest()
        )));
    }
    Ok(())
}

fn current_version(conn: &Connection) -> Result<i64> {
    conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))
        .map_err(|e| StoreError::Backend(format!("cannot read the schema version ({e}); is this a keel database?")))
}

fn newest() -> i64 {
    MIGRATIONS.last().map(|(v, _)| *v).unwrap_or(0)
}

//! Queries, each run on a reader connection.

use keel_protocol::session::{AttemptInfo, SessionInfo, ToolCallInfo, TurnInfo};
use keel_protocol::{AttemptStatus, CompactionRecord, Event, InteractionInfo, Item, ToolCallStatus, TurnStatus};
use keel_store::{Result, StoreError};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::backend;

fn json<T: serde::de::DeserializeOwned>(table: &'static str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt { table, message: e.to_string() })
}

fn corrupt(table: &'static str, message: String) -> StoreError {
    StoreError::Corrupt { table, message }
}

const SESSION_COLUMNS: &str = "id, name, coworker, bundle_path, bundle_digest, coworker_spec, workspace, attended,
    compaction, provider_blocked, created_at_ms, updated_at_ms, current_turn_id, history_len, usage, labels, owner";

fn session_row(row: &Row<'_>) -> rusqlite::Result<Result<SessionInfo>> {
    let spec: String = row.get(5)?;
    let compaction: String = row.get(8)?;
    let usage: String = row.get(14)?;
    let history_len: i64 = row.get(13)?;
    Ok((|| {
        Ok(SessionInfo {
            id: row.get(0).map_err(backend)?,
            name: row.get(1).map_err(backend)?,
            coworker: row.get(2).map_err(backend)?,
            bundle_path: row.get(3).map_err(backend)?,
            bundle_digest: row.get(4).map_err(backend)?,
            coworker_spec: std::sync::Arc::new(json("sessions", &spec)?),
            workspace: row.get(6).map_err(backend)?,
            attended: row.get(7).map_err(backend)?,
            compaction: json("sessions", &compaction)?,
            provider_blocked: row.get(9).map_err(backend)?,
            created_at_ms: row.get(10).map_err(backend)?,
            updated_at_ms: row.get(11).map_err(backend)?,
            current_turn_id: row.get(12).map_err(backend)?,
            history_len: history_len as u64,
            usage: json("sessions", &usage)?,
            labels: json("sessions", &row.get::<_, String>(15).map_err(backend)?)?,
            owner: json("sessions", &row.get::<_, String>(16).map_err(backend)?)?,
        })
    })())
}

pub fn sessions(conn: &Connection) -> Result<Vec<SessionInfo>> {
    let mut st = conn
        .prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions ORDER BY created_at_ms, id"))
        .map_err(backend)?;
    let rows = st.query_map([], session_row).map_err(backend)?;
    rows.map(|r| r.map_err(backend)?).collect()
}

pub fn session(conn: &Connection, id: &str) -> Result<Option<SessionInfo>> {
    let mut st =
        conn.prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1")).map_err(backend)?;
    st.query_row([id], session_row).optional().map_err(backend)?.transpose()
}

const TURN_COLUMNS: &str = "id, session_id, submission_id, status, steps, history_start, error, usage, created_at_ms, updated_at_ms, attempts, continuations, pending_steers";

fn turn_row(row: &Row<'_>) -> rusqlite::Result<Result<TurnInfo>> {
    let status: String = row.get(3)?;
    let error: Option<String> = row.get(6)?;
    let usage: String = row.get(7)?;
    let history_start: i64 = row.get(5)?;
    Ok((|| {
        Ok(TurnInfo {
            id: row.get(0).map_err(backend)?,
            session_id: row.get(1).map_err(backend)?,
            submission_id: row.get(2).map_err(backend)?,
            status: TurnStatus::parse(&status).ok_or_else(|| corrupt("turns", format!("unknown status {status}")))?,
            steps: row.get(4).map_err(backend)?,
            history_start: history_start as u64,
            error: error.map(|e| json("turns", &e)).transpose()?,
            usage: json("turns", &usage)?,
            created_at_ms: row.get(8).map_err(backend)?,
            updated_at_ms: row.get(9).map_err(backend)?,
            attempts: row.get(10).map_err(backend)?,
            continuations: row.get(11).map_err(backend)?,
            pending_steers: json("turns", &row.get::<_, String>(12).map_err(backend)?)?,
        })
    })())
}

pub fn turn(conn: &Connection, id: &str) -> Result<Option<TurnInfo>> {
    let mut st = conn.prepare_cached(&format!("SELECT {TURN_COLUMNS} FROM turns WHERE id = ?1")).map_err(backend)?;
    st.query_row([id], turn_row).optional().map_err(backend)?.transpose()
}

pub fn current_turns(conn: &Connection) -> Result<Vec<TurnInfo>> {
    let columns = TURN_COLUMNS.split(", ").map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ");
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT {columns} FROM turns t JOIN sessions s ON s.current_turn_id = t.id ORDER BY t.created_at_ms"
        ))
        .map_err(backend)?;
    let rows = st.query_map([], turn_row).map_err(backend)?;
    rows.map(|r| r.map_err(backend)?).collect()
}

pub fn turns_with_status(conn: &Connection, statuses: &[TurnStatus]) -> Result<Vec<TurnInfo>> {
    let mut out = Vec::new();
    let mut st = conn
        .prepare_cached(&format!("SELECT {TURN_COLUMNS} FROM turns WHERE status = ?1 ORDER BY created_at_ms, id"))
        .map_err(backend)?;
    for status in statuses {
        let rows = st.query_map([status.as_str()], turn_row).map_err(backend)?;
        for row in rows {
            out.push(row.map_err(backend)??);
        }
    }
    Ok(out)
}

pub fn submission(conn: &Connection, session_id: &str, submission_id: &str) -> Result<Option<String>> {
    conn.prepare_cached("SELECT turn_id FROM submissions WHERE session_id = ?1 AND submission_id = ?2")
        .and_then(|mut st| st.query_row([session_id, submission_id], |r| r.get(0)).optional())
        .map_err(backend)
}

pub fn history(conn: &Connection, session_id: &str, from: u64) -> Result<Vec<Item>> {
    let mut st = conn
        .prepare_cached("SELECT item FROM history WHERE session_id = ?1 AND idx >= ?2 ORDER BY idx")
        .map_err(backend)?;
    let rows = st.query_map(params![session_id, from as i64], |r| r.get::<_, String>(0)).map_err(backend)?;
    rows.map(|r| json("history", &r.map_err(backend)?)).collect()
}

pub fn events(conn: &Connection, session_id: &str, after_seq: u64, limit: u32) -> Result<Vec<Event>> {
    let mut st = conn
        .prepare_cached(
            "SELECT seq, kind, data, at_ms FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .map_err(backend)?;
    let rows = st
        .query_map(params![session_id, after_seq as i64, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?))
        })
        .map_err(backend)?;
    rows.map(|r| {
        let (seq, kind, data, at_ms) = r.map_err(backend)?;
        Ok(Event { session_id: session_id.to_string(), seq: seq as u64, kind, data: json("events", &data)?, at_ms })
    })
    .collect()
}

pub fn attempts(conn: &Connection, session_id: &str) -> Result<Vec<AttemptInfo>> {
    let mut st = conn
        .prepare_cached(
            "SELECT id, turn_id, step, attempt, model, status, text, usage, finish_reason, error, started_at_ms, finished_at_ms
             FROM model_attempts WHERE session_id = ?1 ORDER BY started_at_ms, step, attempt",
        )
        .map_err(backend)?;
    let rows = st
        .query_map([session_id], |r| {
            let status: String = r.get(5)?;
            let usage: String = r.get(7)?;
            Ok((|| {
                Ok(AttemptInfo {
                    id: r.get(0).map_err(backend)?,
                    session_id: session_id.to_string(),
                    turn_id: r.get(1).map_err(backend)?,
                    step: r.get(2).map_err(backend)?,
                    attempt: r.get(3).map_err(backend)?,
                    model: r.get(4).map_err(backend)?,
                    status: AttemptStatus::parse(&status)
                        .ok_or_else(|| corrupt("model_attempts", format!("unknown status {status}")))?,
                    text: r.get(6).map_err(backend)?,
                    usage: json("model_attempts", &usage)?,
                    finish_reason: r.get(8).map_err(backend)?,
                    error: r.get(9).map_err(backend)?,
                    started_at_ms: r.get(10).map_err(backend)?,
                    finished_at_ms: r.get(11).map_err(backend)?,
                })
            })())
        })
        .map_err(backend)?;
    rows.map(|r| r.map_err(backend)?).collect()
}

pub fn tool_calls(conn: &Connection, session_id: &str, turn_id: Option<&str>) -> Result<Vec<ToolCallInfo>> {
    let mut st = conn
        .prepare_cached(
            "SELECT call_id, turn_id, name, arguments, status, output, is_error, started_at_ms, finished_at_ms
             FROM tool_calls WHERE session_id = ?1 AND (?2 IS NULL OR turn_id = ?2) ORDER BY started_at_ms, call_id",
        )
        .map_err(backend)?;
    let rows = st
        .query_map(params![session_id, turn_id], |r| {
            let status: String = r.get(4)?;
            Ok((|| {
                Ok(ToolCallInfo {
                    session_id: session_id.to_string(),
                    call_id: r.get(0).map_err(backend)?,
                    turn_id: r.get(1).map_err(backend)?,
                    name: r.get(2).map_err(backend)?,
                    arguments: r.get(3).map_err(backend)?,
                    status: ToolCallStatus::parse(&status)
                        .ok_or_else(|| corrupt("tool_calls", format!("unknown status {status}")))?,
                    output: r.get(5).map_err(backend)?,
                    is_error: r.get(6).map_err(backend)?,
                    started_at_ms: r.get(7).map_err(backend)?,
                    finished_at_ms: r.get(8).map_err(backend)?,
                })
            })())
        })
        .map_err(backend)?;
    rows.map(|r| r.map_err(backend)?).collect()
}

/// Interactions, oldest first. The whole record is kept in `request`; the
/// other columns index it.
pub fn interactions(conn: &Connection, session_id: Option<&str>, pending_only: bool) -> Result<Vec<InteractionInfo>> {
    let mut st = conn
        .prepare_cached(
            "SELECT request FROM interactions WHERE (?1 IS NULL OR session_id = ?1) AND (?2 = 0 OR status = 'pending')
             ORDER BY created_at_ms, id",
        )
        .map_err(backend)?;
    let rows = st.query_map(params![session_id, pending_only], |r| r.get::<_, String>(0)).map_err(backend)?;
    rows.map(|r| {
        let text = r.map_err(backend)?;
        json("interactions", &text)
    })
    .collect()
}

/// Compaction records, oldest first: of one session or all, and only each
/// session's latest when `latest_only`.
pub fn compactions(conn: &Connection, session_id: Option<&str>, latest_only: bool) -> Result<Vec<CompactionRecord>> {
    let mut st = conn
        .prepare_cached(
            "SELECT record FROM compactions c WHERE (?1 IS NULL OR session_id = ?1)
               AND (?2 = 0 OR number = (SELECT MAX(number) FROM compactions WHERE session_id = c.session_id))
             ORDER BY session_id, number",
        )
        .map_err(backend)?;
    let rows = st.query_map(params![session_id, latest_only], |r| r.get::<_, String>(0)).map_err(backend)?;
    rows.map(|r| {
        let text = r.map_err(backend)?;
        json("compactions", &text)
    })
    .collect()
}

pub fn last_seq(conn: &Connection, session_id: &str) -> Result<u64> {
    let seq: Option<i64> = conn
        .prepare_cached("SELECT last_seq FROM sessions WHERE id = ?1")
        .and_then(|mut st| st.query_row([session_id], |r| r.get(0)).optional())
        .map_err(backend)?;
    Ok(seq.unwrap_or(0) as u64)
}

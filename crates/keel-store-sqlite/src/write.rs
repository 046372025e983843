//! The writer thread: group commit with one savepoint per change.

use std::sync::mpsc;

use keel_protocol::Event;
use keel_protocol::ids::now_ms;
use keel_store::{Change, Result, StoreError};
use rusqlite::{Connection, OptionalExtension, params};

use crate::{MAX_BATCH, WriteJob, backend};

/// Runs until every sender is gone, committing queued changes in batches.
pub(crate) fn writer_loop(mut conn: Connection, jobs: mpsc::Receiver<WriteJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&mut conn, batch);
    }
}

fn commit_batch(conn: &mut Connection, batch: Vec<WriteJob>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let error = backend(e);
        for job in batch {
            let _ = job.reply.send(Err(error.clone()));
        }
        return;
    }
    let mut outcomes = Vec::with_capacity(batch.len());
    for job in &batch {
        outcomes.push(apply_in_savepoint(conn, &job.change));
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let error = backend(e);
        let _ = conn.execute_batch("ROLLBACK");
        tracing::error!(%error, "commit failed; every change in the batch was rolled back");
        for job in batch {
            let _ = job.reply.send(Err(error.clone()));
        }
        return;
    }
    for (job, outcome) in batch.into_iter().zip(outcomes) {
        let _ = job.reply.send(outcome);
    }
}

fn apply_in_savepoint(conn: &Connection, change: &Change) -> Result<Vec<Event>> {
    conn.execute_batch("SAVEPOINT change").map_err(backend)?;
    match apply(conn, change) {
        Ok(events) => {
            conn.execute_batch("RELEASE change").map_err(backend)?;
            Ok(events)
        }
        Err(error) => {
            // If even the rollback fails the transaction is unusable; the
            // COMMIT that follows fails too and every caller gets an error.
            let _ = conn.execute_batch("ROLLBACK TO change; RELEASE change");
            Err(error)
        }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Backend(format!("cannot encode a record: {e}")))
}

fn apply(conn: &Connection, change: &Change) -> Result<Vec<Event>> {
    let now = now_ms();
    if let Some(s) = &change.session {
        if change.new_session {
            insert_session(conn, s)?;
        } else {
            // The pinned fields never change after creation: only the
            // mutable ones are written, which keeps hot commits small.
            let updated = conn
                .prepare_cached(
                    "UPDATE sessions SET name = ?2, attended = ?3, compaction = ?4, provider_blocked = ?5,
                        updated_at_ms = ?6, current_turn_id = ?7, history_len = ?8, usage = ?9, labels = ?10, owner = ?11
                        WHERE id = ?1",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        s.id,
                        s.name,
                        s.attended,
                        to_json(&s.compaction).unwrap_or_default(),
                        s.provider_blocked,
                        s.updated_at_ms,
                        s.current_turn_id,
                        s.history_len as i64,
                        to_json(&s.usage).unwrap_or_default(),
                        to_json(&s.labels).unwrap_or_else(|_| "{}".into()),
                        to_json(&s.owner).unwrap_or_else(|_| "null".into()),
                    ])
                })
                .map_err(backend)?;
            if updated != 1 {
                return Err(StoreError::Rejected(format!("session {} does not exist", s.id)));
            }
            if change.repin {
                conn.prepare_cached(
                    "UPDATE sessions SET coworker_spec = ?2, bundle_digest = ?3, bundle_path = ?4 WHERE id = ?1",
                )
                .and_then(|mut st| {
                    st.execute(params![s.id, s.coworker_spec.to_string(), s.bundle_digest, s.bundle_path])
                })
                .map_err(backend)?;
            }
        }
    }
    for t in &change.turns {
        let error = t.error.as_ref().map(to_json).transpose()?;
        conn.prepare_cached(
            "INSERT INTO turns (id, session_id, submission_id, status, steps, history_start, error, usage, created_at_ms,
                updated_at_ms, attempts, continuations, pending_steers)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, steps = excluded.steps,
                error = excluded.error, usage = excluded.usage, updated_at_ms = excluded.updated_at_ms,
                attempts = excluded.attempts, continuations = excluded.continuations,
                pending_steers = excluded.pending_steers",
        )
        .and_then(|mut st| {
            st.execute(params![
                t.id,
                t.session_id,
                t.submission_id,
                t.status.as_str(),
                t.steps,
                t.history_start as i64,
                error,
                to_json(&t.usage).unwrap_or_default(),
                t.created_at_ms,
                t.updated_at_ms,
                t.attempts,
                t.continuations,
                to_json(&t.pending_steers).unwrap_or_else(|_| "[]".into()),
            ])
        })
        .map_err(backend)?;
    }
    for sub in &change.submissions {
        conn.prepare_cached(
            "INSERT INTO submissions (session_id, submission_id, turn_id, text, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut st| st.execute(params![change.session_id, sub.submission_id, sub.turn_id, sub.text, now]))
        .map_err(backend)?;
    }
    for (idx, item) in &change.history {
        let item = to_json(item)?;
        conn.prepare_cached("INSERT INTO history (session_id, idx, item) VALUES (?1, ?2, ?3)")
            .and_then(|mut st| st.execute(params![change.session_id, *idx as i64, item]))
            .map_err(backend)?;
    }
    if let Some(a) = &change.attempt {
        conn.prepare_cached(
            "INSERT INTO model_attempts (id, session_id, turn_id, step, attempt, model, status, text, usage, finish_reason, error, started_at_ms, finished_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, text = excluded.text, usage = excluded.usage,
                finish_reason = excluded.finish_reason, error = excluded.error, finished_at_ms = excluded.finished_at_ms",
        )
        .and_then(|mut st| {
            st.execute(params![
                a.id,
                a.session_id,
                a.turn_id,
                a.step,
                a.attempt,
                a.model,
                a.status.as_str(),
                a.text,
                to_json(&a.usage).unwrap_or_default(),
                a.finish_reason,
                a.error,
                a.started_at_ms,
                a.finished_at_ms,
            ])
        })
        .map_err(backend)?;
    }
    for c in &change.tool_calls {
        // A ledger row is one call's: an update from another turn or tool
        // (a provider reusing a call id that slipped past keel's own ids)
        // changes no row and is refused below, never merged into it.
        let written = conn
            .prepare_cached(
                "INSERT INTO tool_calls (session_id, call_id, turn_id, name, arguments, status, output, is_error, started_at_ms, finished_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (session_id, call_id) DO UPDATE SET status = excluded.status, output = excluded.output,
                is_error = excluded.is_error, finished_at_ms = excluded.finished_at_ms
             WHERE tool_calls.turn_id = excluded.turn_id AND tool_calls.name = excluded.name",
            )
            .and_then(|mut st| {
            st.execute(params![
                c.session_id,
                c.call_id,
                c.turn_id,
                c.name,
                c.arguments,
                c.status.as_str(),
                c.output,
                c.is_error,
                c.started_at_ms,
                c.finished_at_ms,
            ])
            })
            .map_err(backend)?;
        if written != 1 {
            return Err(StoreError::Rejected(format!(
                "the effect ledger already holds call {} of another turn or tool; refusing to overwrite it with turn {}'s {}",
                c.call_id, c.turn_id, c.name
            )));
        }
    }
    for i in &change.interactions {
        let status = serde_json::to_value(i.status).map_err(|e| StoreError::Backend(e.to_string()))?;
        let decision = i.decision.as_ref().map(to_json).transpose()?;
        let resolved = i.decision.as_ref().map(|d| d.at_ms);
        let record = to_json(i)?;
        conn.prepare_cached(
            "INSERT INTO interactions (id, session_id, turn_id, kind, request, status, response, created_at_ms, resolved_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (id) DO UPDATE SET request = excluded.request, status = excluded.status,
                response = excluded.response, resolved_at_ms = excluded.resolved_at_ms",
        )
        .and_then(|mut st| {
            st.execute(params![
                i.id,
                i.session_id,
                i.turn_id,
                serde_json::to_value(i.kind).unwrap_or_default().as_str().unwrap_or_default(),
                record,
                status.as_str().unwrap_or_default(),
                decision,
                i.created_at_ms,
                resolved,
            ])
        })
        .map_err(backend)?;
    }
    if let Some(record) = &change.compaction {
        let text = to_json(record)?;
        conn.prepare_cached(
            "INSERT INTO compactions (id, session_id, number, record, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .and_then(|mut st| st.execute(params![record.id, change.session_id, record.number, text, record.created_at_ms]))
        .map_err(backend)?;
    }
    append_events(conn, change, now)
}

fn insert_session(conn: &Connection, s: &keel_protocol::session::SessionInfo) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO sessions (id, name, coworker, bundle_path, bundle_digest, coworker_spec, workspace, attended,
            compaction, provider_blocked, created_at_ms, updated_at_ms, current_turn_id, history_len, usage, labels, owner)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )
    .and_then(|mut st| {
        st.execute(params![
            s.id,
            s.name,
            s.coworker,
            s.bundle_path,
            s.bundle_digest,
            s.coworker_spec.to_string(),
            s.workspace,
            s.attended,
            to_json(&s.compaction).unwrap_or_default(),
            s.provider_blocked,
            s.created_at_ms,
            s.updated_at_ms,
            s.current_turn_id,
            s.history_len as i64,
            to_json(&s.usage).unwrap_or_default(),
            to_json(&s.labels).unwrap_or_else(|_| "{}".into()),
            to_json(&s.owner).unwrap_or_else(|_| "null".into()),
        ])
    })
    .map_err(backend)?;
    Ok(())
}

fn append_events(conn: &Connection, change: &Change, now: i64) -> Result<Vec<Event>> {
    if change.events.is_empty() {
        return Ok(Vec::new());
    }
    let count = change.events.len() as i64;
    let last: Option<i64> = conn
        .prepare_cached("UPDATE sessions SET last_seq = last_seq + ?1 WHERE id = ?2 RETURNING last_seq")
        .and_then(|mut st| st.query_row(params![count, change.session_id], |r| r.get(0)).optional())
        .map_err(backend)?;
    let Some(last) = last else {
        return Err(StoreError::Rejected(format!("session {} does not exist", change.session_id)));
    };
    let mut seq = (last - count) as u64;
    let mut events = Vec::with_capacity(change.events.len());
    let mut insert = conn
        .prepare_cached("INSERT INTO events (session_id, seq, kind, data, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)")
        .map_err(backend)?;
    for new in &change.events {
        seq += 1;
        let kind = new.kind.as_str();
        let data = to_json(&new.data)?;
        let at_ms = new.at_ms.unwrap_or(now);
        insert.execute(params![change.session_id, seq as i64, kind, data, at_ms]).map_err(backend)?;
        events.push(Event {
            session_id: change.session_id.clone(),
            seq,
            kind: kind.to_string(),
            data: new.data.clone(),
            at_ms,
        });
    }
    Ok(events)
}

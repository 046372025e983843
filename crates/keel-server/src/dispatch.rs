//! The method table: params in, result out.

use keel_protocol::rpc::{
    EventsSubscribeParams, EventsUnsubscribeParams, InboxListParams, InboxListResponse, InteractionRespondParams,
    RpcError, SessionCreateParams, SessionCreateResponse, SessionIdParams, SessionListResponse, TurnStartParams, code,
};
use keel_runtime::{NewSession, Runtime};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::connection::Connection;
use crate::errors::{plain, to_rpc_error};

/// Every method the server answers.
pub const METHODS: &[&str] = &[
    "session/create",
    "session/get",
    "session/list",
    "session/upgrade",
    "session/compact",
    "session/fork",
    "turn/start",
    "turn/interrupt",
    "turn/resume",
    "turn/steer",
    "interaction/respond",
    "inbox/list",
    "audit/list",
    "events/subscribe",
    "events/unsubscribe",
];

fn params<T: DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    let value = params.unwrap_or_else(|| json!({}));
    serde_json::from_value(value).map_err(|e| plain(code::INVALID_PARAMS, format!("invalid params: {e}")))
}

fn result<T: Serialize>(value: T) -> Result<Value, RpcError> {
    serde_json::to_value(value).map_err(|e| plain(code::INTERNAL_ERROR, format!("cannot encode the result: {e}")))
}

/// Runs one method call.
pub(crate) async fn call(
    runtime: &Runtime,
    connection: &Connection,
    method: &str,
    raw: Option<Value>,
) -> Result<Value, RpcError> {
    let rt = |e: keel_runtime::RuntimeError| to_rpc_error(&e);
    match method {
        "session/create" => {
            let p: SessionCreateParams = params(raw)?;
            let session = runtime
                .create_session(NewSession {
                    name: p.name,
                    coworker: p.coworker,
                    workspace: p.workspace,
                    attended: p.attended.unwrap_or(true),
                    compaction: p.compaction,
                })
                .await
                .map_err(rt)?;
            result(SessionCreateResponse { session })
        }
        "session/get" => {
            let p: SessionIdParams = params(raw)?;
            result(runtime.snapshot(&p.session_id).await.map_err(rt)?)
        }
        "session/list" => {
            let _: serde_json::Map<String, Value> = params(raw)?;
            result(SessionListResponse { sessions: runtime.list_sessions() })
        }
        "session/upgrade" => {
            let p: SessionIdParams = params(raw)?;
            result(SessionCreateResponse { session: runtime.upgrade_session(&p.session_id).await.map_err(rt)? })
        }
        "session/fork" => {
            let p: keel_protocol::rpc::SessionForkParams = params(raw)?;
            result(SessionCreateResponse { session: runtime.fork_session(&p.session_id, p.at_seq).await.map_err(rt)? })
        }
        "session/compact" => {
            let p: SessionIdParams = params(raw)?;
            result(runtime.compact_session(&p.session_id).await.map_err(rt)?)
        }
        "turn/start" => {
            let p: TurnStartParams = params(raw)?;
            result(runtime.start_turn(&p.session_id, &p.submission_id, &p.text).await.map_err(rt)?)
        }
        "turn/interrupt" => {
            let p: SessionIdParams = params(raw)?;
            result(runtime.interrupt_turn(&p.session_id).await.map_err(rt)?)
        }
        "turn/resume" => {
            let p: SessionIdParams = params(raw)?;
            result(runtime.resume_turn(&p.session_id).await.map_err(rt)?)
        }
        "turn/steer" => {
            let p: TurnStartParams = params(raw)?;
            result(runtime.steer_turn(&p.session_id, &p.submission_id, &p.text).await.map_err(rt)?)
        }
        "interaction/respond" => {
            let p: InteractionRespondParams = params(raw)?;
            let outcome = runtime
                .respond_interaction(&p.session_id, &p.interaction_id, p.decision, p.message)
                .await
                .map_err(rt)?;
            result(outcome)
        }
        "inbox/list" => {
            let p: InboxListParams = params(raw)?;
            let interactions = runtime
                .inbox(p.session_id.as_deref())
                .into_iter()
                .filter(|i| !p.unattended_only || !i.attended)
                .collect();
            result(InboxListResponse { interactions })
        }
        "audit/list" => {
            #[derive(serde::Deserialize)]
            struct AuditParams {
                session_id: String,
                #[serde(flatten)]
                filter: keel_runtime::audit::AuditFilter,
            }
            let p: AuditParams = params(raw)?;
            let entries = runtime.audit(&p.session_id, &p.filter).await.map_err(rt)?;
            result(json!({ "entries": entries }))
        }
        "events/subscribe" => {
            let p: EventsSubscribeParams = params(raw)?;
            let stream = runtime.subscribe(&p.session_id, p.after_seq).await.map_err(rt)?;
            result(connection.add_subscription(p.session_id, stream))
        }
        "events/unsubscribe" => {
            let p: EventsUnsubscribeParams = params(raw)?;
            if connection.remove_subscription(&p.subscription_id) {
                result(json!({ "unsubscribed": true }))
            } else {
                Err(plain(code::NOT_FOUND, format!("subscription {} not found", p.subscription_id)))
            }
        }
        other => {
            Err(plain(code::METHOD_NOT_FOUND, format!("unknown method {other:?}; methods: {}", METHODS.join(", "))))
        }
    }
}

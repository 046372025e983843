//! The runtime handle and the session and turn operations behind the API.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use keel_core::TurnLimits;
use keel_protocol::ids::{new_id, now_ms};
use keel_protocol::rpc::{SessionSnapshot, SessionSummary, TurnControlResponse, TurnStartResponse};
use keel_protocol::session::{SessionInfo, TurnInfo};
use keel_protocol::{CompactionSettings, EventKind, Item, TurnStatus, Usage};
use keel_store::{NewEvent, Store, SubmissionRecord};
use keel_store_sqlite::SqliteStore;
use keel_tools::Registry;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bundle::{Bundle, CoworkerSpec};
use crate::config::{ProviderSet, RuntimeConfig};
use crate::error::{Result, RuntimeError};
use crate::events::EventStream;
use crate::slot::{Job, SessionSlot};
use crate::state_dir::{self, StateLock};

/// A running keel runtime. Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub store: Arc<dyn Store>,
    pub bundles: Vec<Bundle>,
    pub providers: ProviderSet,
    /// Built-in tools (run in the sandboxed runner) and the embedder's.
    pub tools: Registry,
    pub runner: keel_runner::RunnerPool,
    pub mcp: crate::mcp::McpTools,
    pub images: crate::images::ImageStore,
    pub state_dir: std::path::PathBuf,
    pub model_override: Option<String>,
    pub default_limits: TurnLimits,
    pub sessions: Mutex<HashMap<String, Arc<SessionSlot>>>,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    pub metrics: crate::metrics::Metrics,
    pub retry: crate::retry::RetryPolicy,
    pub breakers: crate::retry::Breakers,
    /// Token counter and context window per `provider:model`.
    pub counters: crate::compaction::Counters,
    pub telemetry: keel_telemetry::Telemetry,
    /// This process, as ownership records name it.
    pub owner: Arc<keel_protocol::session::Owner>,
    _lock: StateLock,
}

/// Parameters of a new session.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub name: String,
    pub coworker: String,
    pub workspace: String,
    pub attended: bool,
    /// `None` takes the coworker's `compaction` from its bundle, else the
    /// defaults.
    pub compaction: Option<CompactionSettings>,
}

impl Runtime {
    /// Opens the state directory: takes its lock, migrates the database,
    /// loads sessions, and marks turns that were running as `interrupted`.
    pub async fn open(config: RuntimeConfig) -> Result<Runtime> {
        state_dir::ensure(&config.state_dir)?;
        let lock = state_dir::lock(&config.state_dir)?;
        let runner = keel_runner::RunnerPool::new(config.runner.clone(), config.runner_idle);
        let mut tools = Registry::default();
        for tool in crate::tools::RunnerTool::all(&runner, config.state_dir.join("scratch")) {
            tools.register(tool);
        }
        for tool in &config.extra_tools {
            tools.register(tool.clone());
        }
        let tool_names: Vec<String> = tools.names().map(String::from).collect();
        for dir in &config.bundles {
            let problems = crate::bundle_check::validate(dir, &config.providers.names(), &tool_names);
            if !problems.is_empty() {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                return Err(RuntimeError::Config(format!("the bundle has problems:\n  {}", list.join("\n  "))));
            }
        }
        let bundles = config.bundles.iter().map(|dir| Bundle::load(dir)).collect::<Result<Vec<_>>>()?;
        check_unique_coworkers(&bundles)?;
        register_secrets(&config, &bundles);
        let mcp = crate::mcp::McpTools::start(&bundles)?;
        let state_dir = config.state_dir.canonicalize().unwrap_or_else(|_| config.state_dir.clone());
        let dir = config.state_dir.clone();
        let store = tokio::task::spawn_blocking(move || SqliteStore::open(&dir))
            .await
            .map_err(|e| RuntimeError::Config(format!("cannot open the store: {e}")))??;
        let store: Arc<dyn Store> = Arc::new(store);
        let owner = Arc::new(keel_protocol::session::Owner {
            machine_id: state_dir::machine_id(&config.state_dir)?,
            process_id: std::process::id(),
            instance_id: new_id("ins"),
        });
        let infos = store.sessions().await?;
        let mut turns: HashMap<String, TurnInfo> =
            store.current_turns().await?.into_iter().map(|t| (t.session_id.clone(), t)).collect();
        let mut interactions: HashMap<String, Vec<keel_protocol::InteractionInfo>> = HashMap::new();
        for interaction in store.interactions(None, false).await? {
            interactions.entry(interaction.session_id.clone()).or_default().push(interaction);
        }
        let mut compactions: HashMap<String, keel_protocol::CompactionRecord> = HashMap::new();
        for record in store.compactions(None, true).await? {
            compactions.insert(record.session_id.clone(), record);
        }
        let sessions = infos
            .into_iter()
            .map(|info| {
                let turn = turns.remove(&info.id);
                let current = turn.as_ref().map(|t| t.id.clone()).unwrap_or_default();
                let kept = interactions
                    .remove(&info.id)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|i| crate::approvals::keep(i, &current))
                    .collect();
                let compaction = compactions.remove(&info.id);
                let slot = SessionSlot::new(info, turn, kept, compaction, owner.clone());
                (slot.id.clone(), Arc::new(slot))
            })
            .collect();
        let runtime = Runtime {
            inner: Arc::new(Inner {
                store,
                bundles,
                providers: config.providers,
                tools,
                runner,
                mcp,
                images: Default::default(),
                state_dir,
                model_override: config.model_override,
                default_limits: config.default_limits,
                sessions: Mutex::new(sessions),
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                metrics: Default::default(),
                retry: config.retry,
                breakers: Default::default(),
                counters: Default::default(),
                telemetry: config.telemetry.clone(),
                owner,
                _lock: lock,
            }),
        };
        crate::telemetry::register(&runtime.inner.telemetry);
        runtime.mark_interrupted().await?;
        runtime.start_expiry_sweeper();
        Ok(runtime)
    }

    pub(crate) fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// The runtime's own counters.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.inner.metrics
    }

    /// Every loaded bundle.
    pub fn bundles(&self) -> &[Bundle] {
        &self.inner.bundles
    }

    pub(crate) fn slot(&self, session_id: &str) -> Result<Arc<SessionSlot>> {
        let sessions = self.inner.sessions.lock().map_err(|_| RuntimeError::ShuttingDown)?;
        sessions
            .get(session_id)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound { what: "session", id: session_id.to_string() })
    }

    pub(crate) fn all_slots(&self) -> Vec<Arc<SessionSlot>> {
        self.inner.sessions.lock().map(|s| s.values().cloned().collect()).unwrap_or_default()
    }

    /// The coworker `id` as its bundle defines it now: the bundle is read
    /// again from disk (and checked), so new sessions and upgrades see the
    /// current file while existing sessions keep what they pinned.
    fn find_coworker(&self, id: &str) -> Result<(Bundle, CoworkerSpec)> {
        for loaded in &self.inner.bundles {
            if !loaded.coworkers.contains_key(id) {
                continue;
            }
            let tool_names: Vec<String> = self.inner.tools.names().map(String::from).collect();
            let problems = crate::bundle_check::validate(&loaded.root, &self.inner.providers.names(), &tool_names);
            if !problems.is_empty() {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                return Err(RuntimeError::Config(format!(
                    "the bundle has problems now; fix them first:\n  {}",
                    list.join("\n  ")
                )));
            }
            let bundle = Bundle::load(&loaded.root)?;
            let Some(spec) = bundle.coworkers.get(id) else { continue };
            let mut spec = spec.clone();
            if let Some(model) = &self.inner.model_override {
                spec.model = model.clone();
                spec.fallback_models.clear();
                spec.prices = bundle.prices.get(model).map(|p| [(model.clone(), p.clone())].into()).unwrap_or_default();
            }
            return Ok((bundle, spec));
        }
        let known: Vec<&str> = self.inner.bundles.iter().flat_map(|b| b.coworkers.keys().map(String::as_str)).collect();
        Err(RuntimeError::InvalidParams(if known.is_empty() {
            format!("no coworker {id:?}: this keel serves no bundle; start it with --bundle <dir>")
        } else {
            format!("no coworker {id:?}; coworkers served: {}", known.join(", "))
        }))
    }

    /// Creates a session for a coworker and a workspace directory.
    pub async fn create_session(&self, params: NewSession) -> Result<SessionInfo> {
        if params.name.trim().is_empty() {
            return Err(RuntimeError::InvalidParams("name must not be empty".into()));
        }
        let (bundle, mut spec) = self.find_coworker(&params.coworker)?;
        if spec.tools.iter().any(|entry| self.inner.mcp.is_server(keel_tools::split_qualified(entry).0)) {
            // Pin what the MCP servers offer once they have had their chance
            // to start, not an empty list from a server still starting.
            self.inner.mcp.settled().await;
        }
        self.pin_tools(&mut spec)?;
        for model in std::iter::once(&spec.model).chain(&spec.fallback_models) {
            self.inner.providers.resolve(model)?;
        }
        let workspace = Path::new(&params.workspace);
        let workspace = workspace.canonicalize().map_err(|e| {
            RuntimeError::InvalidParams(format!(
                "workspace {:?} cannot be used: {e}; create the folder first",
                params.workspace
            ))
        })?;
        if !workspace.is_dir() {
            return Err(RuntimeError::InvalidParams(format!("workspace {:?} is not a folder", params.workspace)));
        }
        if self.inner.state_dir.starts_with(&workspace) {
            return Err(RuntimeError::InvalidParams(format!(
                "workspace {:?} contains keel's state directory (its journal and access token); choose a folder that does not",
                params.workspace
            )));
        }
        // Inside it is no better: `<state>/scratch` holds every session's
        // HOME and TMPDIR, the rest keel's journal, token and bundles.
        if workspace.starts_with(&self.inner.state_dir) {
            return Err(RuntimeError::InvalidParams(format!(
                "workspace {:?} is inside keel's state directory (every session's scratch space, the journal and the access token); choose a folder outside it",
                params.workspace
            )));
        }
        let now = now_ms();
        let info = SessionInfo {
            id: new_id("ses"),
            name: params.name,
            coworker: params.coworker,
            bundle_path: bundle.root.display().to_string(),
            bundle_digest: spec.digest(),
            coworker_spec: Arc::new(serde_json::to_value(&spec).unwrap_or_default()),
            workspace: workspace.display().to_string(),
            attended: params.attended,
            compaction: params.compaction.or(spec.compaction).unwrap_or_default(),
            provider_blocked: false,
            created_at_ms: now,
            updated_at_ms: now,
            current_turn_id: None,
            history_len: 0,
            usage: Usage::default(),
            labels: Default::default(),
            owner: None,
        };
        self.insert_session(info).await
    }

    /// Commits a new session exactly as `info` says (its pinned coworker
    /// included) and serves it.
    pub(crate) async fn insert_session(&self, info: SessionInfo) -> Result<SessionInfo> {
        self.insert_session_with(info, json!({}), |_, _| Ok(())).await
    }

    /// [`Self::insert_session`], with more in the creating commit: `extra`
    /// fields in the `session_created` event and whatever `build` adds.
    pub(crate) async fn insert_session_with<F>(
        &self,
        info: SessionInfo,
        extra: serde_json::Value,
        build: F,
    ) -> Result<SessionInfo>
    where
        F: FnOnce(&mut crate::slot::SessionState, &mut keel_store::Change) -> Result<()>,
    {
        let info = SessionInfo { owner: Some((*self.inner.owner).clone()), ..info };
        let slot = Arc::new(SessionSlot::new(info.clone(), None, Vec::new(), None, self.inner.owner.clone()));
        let mut created = json!({ "session": info });
        if let (Some(created), Some(extra)) = (created.as_object_mut(), extra.as_object()) {
            created.extend(extra.clone());
        }
        slot.transact(self.store(), |state, change| {
            change.new_session = true;
            change.events.push(NewEvent::new(EventKind::SessionCreated, created));
            build(state, change)
        })
        .await?;
        let info = slot.state().info;
        self.inner.sessions.lock().map_err(|_| RuntimeError::ShuttingDown)?.insert(info.id.clone(), slot);
        Ok(info)
    }

    /// Re-pins a session to its coworker's current definition and tools
    /// (after the bundle or keel changed). A person's decision: keel never
    /// upgrades a session by itself.
    pub async fn upgrade_session(&self, session_id: &str) -> Result<SessionInfo> {
        let slot = self.slot(session_id)?;
        let _control = slot.control.lock().await;
        if let Some((_, _, mut done)) = slot.job_turn() {
            let ended = slot.state().turn.is_some_and(|t| t.status.is_terminal());
            if !ended {
                return Err(RuntimeError::Busy(
                    "the session's turn is running; upgrade it when the turn has ended".into(),
                ));
            }
            // The turn has ended durably; its driver is only checkpointing.
            let _ = done.wait_for(|finished| *finished).await;
        }
        let coworker = slot.state().info.coworker;
        let (bundle, mut spec) = self.find_coworker(&coworker)?;
        self.pin_tools(&mut spec)?;
        let digest = spec.digest();
        let pinned = Arc::new(serde_json::to_value(&spec).unwrap_or_default());
        let root = bundle.root.display().to_string();
        slot.transact(self.store(), |state, change| {
            change.events.push(NewEvent::new(
                EventKind::SessionUpgraded,
                json!({ "from": state.info.bundle_digest, "to": digest, "bundle_path": root }),
            ));
            state.info.coworker_spec = pinned;
            state.info.bundle_digest = digest.clone();
            state.info.bundle_path = root.clone();
            change.repin = true;
            Ok(())
        })
        .await?;
        Ok(slot.state().info)
    }

    /// Every session, newest activity first.
    pub fn list_sessions(&self) -> Vec<SessionSummary> {
        let mut list: Vec<SessionSummary> = self
            .all_slots()
            .iter()
            .map(|slot| {
                let state = slot.state();
                SessionSummary {
                    id: state.info.id,
                    name: state.info.name,
                    coworker: state.info.coworker,
                    turn_status: state.turn.map(|t| t.status),
                    updated_at_ms: state.info.updated_at_ms,
                }
            })
            .collect();
        list.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then_with(|| a.id.cmp(&b.id)));
        list
    }

    /// The committed session and current turn, as served.
    pub fn session_state(&self, session_id: &str) -> Result<(SessionInfo, Option<TurnInfo>)> {
        let state = self.slot(session_id)?.state();
        Ok((state.info, state.turn))
    }

    /// A full snapshot: session, turn, history, attempts and effect ledger.
    pub async fn snapshot(&self, session_id: &str) -> Result<SessionSnapshot> {
        let slot = self.slot(session_id)?;
        let state = slot.state();
        let store = self.store();
        let history = store.history(session_id.to_string(), 0).await?;
        let attempts = store.attempts(session_id.to_string()).await?;
        let tool_calls = store.tool_calls(session_id.to_string(), None).await?;
        let last_seq = store.last_seq(session_id.to_string()).await?;
        let context = self.context_usage(&slot, &history).await.ok();
        Ok(SessionSnapshot {
            session: state.info,
            turn: state.turn,
            history,
            interactions: state.interactions.iter().filter_map(|i| serde_json::to_value(i).ok()).collect(),
            attempts,
            tool_calls,
            last_seq,
            compaction: state.compaction.as_deref().cloned(),
            context,
        })
    }

    /// Delivers a person's message to the session's unfinished turn before
    /// its next model request. Idempotent by `submission_id`; journaled with
    /// the turn, so a steer accepted before a crash is delivered after it.
    pub async fn steer_turn(&self, session_id: &str, submission_id: &str, text: &str) -> Result<TurnStartResponse> {
        check_text_size(text)?;
        if submission_id.trim().is_empty() {
            return Err(RuntimeError::InvalidParams("submission_id must not be empty".into()));
        }
        if text.trim().is_empty() {
            return Err(RuntimeError::InvalidParams("text must not be empty".into()));
        }
        let slot = self.slot(session_id)?;
        let _control = slot.control.lock().await;
        if let Some(turn_id) = self.store().submission(session_id.into(), submission_id.into()).await? {
            return Ok(TurnStartResponse { turn_id, duplicate: true });
        }
        let Some(turn) = slot.state().turn.filter(|t| !t.status.is_terminal()) else {
            return Err(RuntimeError::Conflict(
                "the session has no unfinished turn to steer; start one with turn/start".into(),
            ));
        };
        let turn_id = turn.id.clone();
        let steer = keel_protocol::session::Steer {
            submission_id: submission_id.to_string(),
            text: text.to_string(),
            at_ms: now_ms(),
        };
        slot.transact(self.store(), |state, change| {
            let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id) else {
                return Err(RuntimeError::Conflict("the turn ended meanwhile; start a new one with turn/start".into()));
            };
            turn.pending_steers.push(steer.clone());
            change.submissions.push(SubmissionRecord {
                submission_id: submission_id.to_string(),
                turn_id: turn_id.clone(),
                text: text.to_string(),
            });
            change.events.push(NewEvent::new(
                EventKind::TurnSteered,
                json!({ "turn_id": turn_id, "submission_id": submission_id, "text": text }),
            ));
            Ok(())
        })
        .await?;
        Ok(TurnStartResponse { turn_id, duplicate: false })
    }

    /// Starts a turn for a submission, or returns the turn an earlier
    /// submission with the same id started.
    pub async fn start_turn(&self, session_id: &str, submission_id: &str, text: &str) -> Result<TurnStartResponse> {
        if submission_id.trim().is_empty() {
            return Err(RuntimeError::InvalidParams("submission_id must not be empty".into()));
        }
        check_text_size(text)?;
        let slot = self.slot(session_id)?;
        let _control = slot.control.lock().await;
        if let Some(turn_id) = self.store().submission(session_id.into(), submission_id.into()).await? {
            return Ok(TurnStartResponse { turn_id, duplicate: true });
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(RuntimeError::ShuttingDown);
        }
        let state = slot.state();
        if slot.has_job() {
            return Err(match &state.turn {
                Some(turn) if turn.status.is_terminal() => RuntimeError::Busy(format!(
                    "the previous turn {} is {} and still checkpointing; retry in a moment",
                    turn.id,
                    turn.status.as_str()
                )),
                Some(turn) => RuntimeError::Busy(format!(
                    "turn {} is still {}; wait for it to finish, or stop it with turn/interrupt",
                    turn.id,
                    turn.status.as_str()
                )),
                None => RuntimeError::Busy("the session is busy; retry in a moment".into()),
            });
        }
        if let Some(turn) = &state.turn
            && !turn.status.is_terminal()
        {
            return Err(RuntimeError::Conflict(format!(
                "turn {} is {}; continue it with turn/resume or drop it with turn/interrupt before starting another",
                turn.id,
                turn.status.as_str()
            )));
        }
        if state.info.provider_blocked {
            return Err(RuntimeError::Blocked(
                "a model provider blocked this session on safety grounds; it accepts no new turns, start a new session"
                    .into(),
            ));
        }
        let turn_id = new_id("turn");
        let now = now_ms();
        let item = Item::user_text(text);
        slot.transact(self.store(), |state, change| {
            let index = state.info.history_len;
            state.turn = Some(TurnInfo {
                id: turn_id.clone(),
                session_id: state.info.id.clone(),
                submission_id: submission_id.to_string(),
                status: TurnStatus::Running,
                steps: 0,
                attempts: 0,
                continuations: 0,
                history_start: index,
                error: None,
                usage: Usage::default(),
                created_at_ms: now,
                updated_at_ms: now,
                pending_steers: Vec::new(),
            });
            state.info.current_turn_id = Some(turn_id.clone());
            state.info.history_len += 1;
            change.submissions.push(SubmissionRecord {
                submission_id: submission_id.to_string(),
                turn_id: turn_id.clone(),
                text: text.to_string(),
            });
            change.history.push((index, item.clone()));
            change.events.push(NewEvent::new(
                EventKind::TurnStarted,
                json!({ "turn_id": turn_id, "submission_id": submission_id }),
            ));
            change
                .events
                .push(NewEvent::new(EventKind::ItemAdded, json!({ "turn_id": turn_id, "index": index, "item": item })));
            Ok(())
        })
        .await?;
        self.spawn_driver(slot.clone(), turn_id.clone(), keel_core::Next::CallModel);
        Ok(TurnStartResponse { turn_id, duplicate: false })
    }

    /// Starts the driver task for a turn. The caller holds the control lock.
    pub(crate) fn spawn_driver(&self, slot: Arc<SessionSlot>, turn_id: String, next: keel_core::Next) {
        let cancel = self.inner.shutdown.child_token();
        let (done_tx, done_rx) = watch::channel(false);
        if let Ok(mut job) = slot.job.lock() {
            *job = Some(Job { turn_id: turn_id.clone(), cancel: cancel.clone(), done: done_rx });
        }
        let runtime = self.clone();
        self.inner.tasks.spawn(async move {
            crate::driver::drive(&runtime, &slot, &turn_id, next, &cancel).await;
            if let Ok(mut job) = slot.job.lock()
                && job.as_ref().is_some_and(|j| j.turn_id == turn_id)
            {
                *job = None;
            }
            let _ = done_tx.send(true);
        });
    }

    /// Stops the session's turn. A running turn's driver stops at once
    /// (dropping any in-flight model request) and records it `cancelled`; an
    /// interrupted or recoverable turn is dropped as `cancelled`.
    pub async fn interrupt_turn(&self, session_id: &str) -> Result<TurnControlResponse> {
        let slot = self.slot(session_id)?;
        slot.cancel_compaction();
        let _control = slot.control.lock().await;
        if let Some((turn_id, cancel, mut done)) = slot.job_turn() {
            cancel.cancel();
            let _ = done.wait_for(|finished| *finished).await;
            let status = slot.state().turn.map(|t| t.status).unwrap_or(TurnStatus::Cancelled);
            return Ok(TurnControlResponse { turn_id, status });
        }
        let state = slot.state();
        let Some(turn) = state.turn else {
            return Err(RuntimeError::Conflict("the session has no turn to interrupt".into()));
        };
        if turn.status.is_terminal() {
            return Ok(TurnControlResponse { turn_id: turn.id, status: turn.status });
        }
        let ending = crate::driver::Ending::new(TurnStatus::Cancelled, None, "the person cancelled the turn");
        crate::driver::finish(self, &slot, &turn.id, ending).await?;
        Ok(TurnControlResponse { turn_id: turn.id, status: TurnStatus::Cancelled })
    }

    /// The seq of the session's last committed event.
    pub async fn snapshot_last_seq(&self, session_id: &str) -> Result<u64> {
        self.slot(session_id)?;
        Ok(self.store().last_seq(session_id.to_string()).await?)
    }

    /// Subscribes to a session's events after `after_seq`.
    pub async fn subscribe(&self, session_id: &str, after_seq: u64) -> Result<EventStream> {
        let slot = self.slot(session_id)?;
        let last = self.store().last_seq(session_id.to_string()).await?;
        if after_seq > last {
            return Err(RuntimeError::InvalidParams(format!(
                "after_seq {after_seq} is past the session's last event {last}; pass the last seq you received, or 0"
            )));
        }
        let live = slot.subscribe();
        Ok(EventStream::new(self.inner.store.clone(), session_id.to_string(), after_seq, live))
    }

    /// Stops every driver and waits for them to record where they stopped.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.runner.stop_all();
        self.inner.mcp.shutdown().await;
    }

    /// Checks pending interactions for expiry once a second until shutdown.
    fn start_expiry_sweeper(&self) {
        let weak = Arc::downgrade(&self.inner);
        let shutdown = self.inner.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                if let Err(error) = (Runtime { inner }).expire_due().await {
                    tracing::warn!(%error, "expiring interactions failed; retrying in a second");
                }
            }
        });
    }

    /// The MCP servers and how they are, once each has had its chance to
    /// start (for `keel doctor`).
    pub async fn mcp_servers(&self) -> Vec<keel_mcp::ServerStatus> {
        self.inner.mcp.settled().await;
        self.inner.mcp.status()
    }

    /// The audit view of a session's tool calls (see [`crate::audit`]).
    pub async fn audit(
        &self,
        session_id: &str,
        filter: &crate::audit::AuditFilter,
    ) -> Result<Vec<crate::audit::AuditEntry>> {
        self.slot(session_id)?;
        crate::audit::audit(self.store(), session_id, filter).await
    }

    /// Runner processes alive and idle.
    pub fn idle_runners(&self) -> usize {
        self.inner.runner.idle_runners()
    }
}

/// Registers every value keel knows to be secret: the configured ones
/// (provider keys), the environment values coworkers pass to tools, and MCP
/// servers' environment and header values.
fn register_secrets(config: &RuntimeConfig, bundles: &[Bundle]) {
    let mut secrets = config.secrets.clone();
    for bundle in bundles {
        for spec in bundle.coworkers.values() {
            for name in &spec.resources.env {
                if let Ok(value) = std::env::var(name) {
                    secrets.push((name.clone(), value));
                }
            }
        }
        for (server, spec) in &bundle.mcp_servers {
            for (name, value) in spec.env.iter().chain(&spec.headers) {
                secrets.push((format!("{server}.{name}"), value.clone()));
            }
        }
    }
    crate::secrets::register(secrets);
}

fn check_unique_coworkers(bundles: &[Bundle]) -> Result<()> {
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for bundle in bundles {
        for id in bundle.coworkers.keys() {
            if let Some(other) = seen.insert(id, &bundle.root) {
                return Err(RuntimeError::Config(format!(
                    "the coworker {id:?} is defined in both {} and {}; coworker ids must be unique across bundles",
                    other.display(),
                    bundle.root.display()
                )));
            }
        }
    }
    Ok(())
}

/// The largest text a person may submit as a turn or a steer, in bytes.
pub const MAX_TURN_TEXT: usize = 1024 * 1024;

/// Refuses a turn or steer text over [`MAX_TURN_TEXT`]: a 15 MB text grew
/// the journal by 93 MB (it is journaled with its submission, its history
/// item and their events) for no model that could read it.
fn check_text_size(text: &str) -> Result<()> {
    if text.len() > MAX_TURN_TEXT {
        return Err(RuntimeError::InvalidParams(format!(
            "the text is {} bytes, over the limit of {MAX_TURN_TEXT} bytes for a turn; put large inputs in a file in the workspace and refer to it",
            text.len()
        )));
    }
    Ok(())
}

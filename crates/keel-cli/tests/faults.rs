//! Fault injection through the real binary: storage that fails (a full
//! disk on a small tmpfs, a read-only state directory, a corrupt database),
//! providers that misbehave (hang, drip, send garbage, send too much), and a
//! runner killed mid-call. Each asserts the outcome: a clear error, nothing
//! lost, nothing overwritten, keel still serving.
//!
//! The storage tests mount inside a user and mount namespace made by
//! `unshare` (the same kernel feature keel's sandbox needs), so they run
//! unprivileged and leave nothing mounted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keel_testkit::{MockServer, Reply};
use serde_json::json;
use support::{Client, Keel};

fn keel_bin() -> &'static str {
    env!("CARGO_BIN_EXE_keel")
}

fn sha(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Runs `keel serve` on `state` and returns how it ended (it must not
/// start): exit status and stderr.
fn serve_refused(command: &mut Command) -> (bool, String) {
    let output = command.stdin(Stdio::null()).output().unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A state directory with one session in it, made by a real keel.
async fn state_with_a_session(dir: &Path) -> (PathBuf, String) {
    let state = dir.join("state");
    let ws = dir.join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    drop(client);
    keel.terminate();
    keel.wait();
    (state, id)
}

#[tokio::test]
async fn a_corrupt_database_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _) = state_with_a_session(dir.path()).await;
    let db = state.join("runtime.sqlite3");
    let mut bytes = std::fs::read(&db).unwrap();
    for byte in bytes.iter_mut().take(4096).skip(16) {
        *byte ^= 0x5a;
    }
    std::fs::write(&db, &bytes).unwrap();
    let _ = std::fs::remove_file(state.join("runtime.sqlite3-wal"));
    let before = sha(&db);
    let (ok, stderr) =
        serve_refused(Command::new(keel_bin()).arg("--state").arg(&state).args(["serve", "--listen", "127.0.0.1:0"]));
    assert!(!ok, "keel must not serve a corrupt database");
    assert!(stderr.contains("runtime.sqlite3") && stderr.to_lowercase().contains("corrupt"), "{stderr}");
    assert_eq!(sha(&db), before, "nothing was overwritten");
}

#[tokio::test]
async fn a_read_only_state_directory_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _) = state_with_a_session(dir.path()).await;
    let db = state.join("runtime.sqlite3");
    let before = sha(&db);
    // Root ignores file modes, so make the directory read-only for real: a
    // read-only bind mount in a private mount namespace.
    let script = r#"mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$1" --state "$0" serve --listen 127.0.0.1:0"#;
    let (ok, stderr) = serve_refused(
        Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", script])
            .arg(&state)
            .arg(keel_bin()),
    );
    assert!(!ok, "keel must not run on a read-only state directory");
    assert!(stderr.contains("read-only") || stderr.contains("Read-only"), "{stderr}");
    assert_eq!(sha(&db), before, "nothing was overwritten");
}

/// `keel serve` with its state directory on a tmpfs of `size`, filled with
/// a `ballast` file of `ballast_kib`, in its own user and mount namespace.
struct FullDisk {
    child: Child,
    url: String,
    state: PathBuf,
}

impl FullDisk {
    fn start(state: &Path, base_url: &str, size: &str, ballast_kib: u32) -> FullDisk {
        std::fs::create_dir_all(state).unwrap();
        let script = format!(
            r#"mount -t tmpfs -o size={size} tmpfs "$0" && dd if=/dev/zero of="$0/ballast" bs=1024 count={ballast_kib} 2>/dev/null && exec "$1" --state "$0" serve --listen 127.0.0.1:0 --bundle "$2""#
        );
        let mut child = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
            .arg(state)
            .arg(keel_bin())
            .arg(support::example_bundle())
            .env("OPENAI_BASE_URL", base_url)
            .env("OPENAI_API_KEY", "sk-test-key")
            .env("KEEL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("keel exited before listening").unwrap();
            if let Some(rest) = line.strip_prefix("keel: serving JSON-RPC on ") {
                break rest.trim().to_string();
            }
        };
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("keel: {line}");
            }
        });
        FullDisk { child, url, state: state.to_path_buf() }
    }

    /// The state directory as keel sees it (through its mount namespace).
    fn inside(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{}", self.child.id(), self.state.join(name).display()))
    }

    async fn client(&self) -> Client {
        let token = std::fs::read_to_string(self.inside("token")).unwrap();
        Client::connect(&self.url, token.trim()).await.unwrap()
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_full_disk_refuses_changes_cleanly_and_keel_goes_on_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockServer::start_with(keel_testkit::responders::always(Reply::text("noted"))).await.unwrap();
    let disk = FullDisk::start(&dir.path().join("state"), &mock.base_url(), "4m", 2048);
    let mut client = disk.client().await;
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    let big = "x".repeat(300 * 1024);
    let mut accepted = Vec::new();
    let mut stuck = false;
    for n in 0..20 {
        let submission = format!("s{n}");
        match client
            .call("turn/start", json!({"session_id": id, "submission_id": submission, "text": big}))
            .await
            .unwrap()
        {
            Err(failure) => {
                // Refused before anything was applied.
                assert_eq!(failure.code, -32005, "{}", failure.message);
                break;
            }
            Ok(_) => {
                accepted.push(submission);
                match tokio::time::timeout(Duration::from_secs(5), client.events_until("turn_finished")).await {
                    Ok(events) => assert_eq!(events.unwrap().last().unwrap()["data"]["status"], "completed"),
                    // A later commit of the turn hit the full disk: the turn
                    // cannot be recorded as ended until space returns.
                    Err(_) => {
                        stuck = true;
                        break;
                    }
                }
            }
        }
    }
    assert!(accepted.len() < 20, "the disk filled up");
    eprintln!("full disk after {} turns; a turn was stuck mid-way: {stuck}", accepted.len());
    // Still serving, and every acknowledged message is there.
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let texts: Vec<&str> = snapshot["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["role"] == "user")
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), accepted.len(), "every acknowledged submission is in history");
    // Space comes back: a stuck turn is recorded interrupted, resumes, and
    // the next submission goes through.
    std::fs::remove_file(disk.inside("ballast")).unwrap();
    if stuck {
        client.wait_for_status(&id, "interrupted").await.unwrap();
        client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
        let events = client.events_until("turn_finished").await.unwrap();
        assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    }
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s-after", "text": "small one"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");

    // Full again, now mid-turn: the message fits, the model's long answer
    // does not. The turn cannot even be recorded as failed; once space
    // returns keel records it interrupted, and it resumes.
    let ballast = disk.inside("ballast-2");
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&ballast).unwrap();
        while file.write_all(&[0u8; 64 * 1024]).is_ok() {}
        let len = file.metadata().unwrap().len();
        file.set_len(len.saturating_sub(160 * 1024)).unwrap();
    }
    mock.push(Reply::text("y".repeat(600 * 1024)));
    client
        .ok("turn/start", json!({"session_id": id, "submission_id": "s-mid", "text": "answer at length"}))
        .await
        .unwrap();
    let mid = tokio::time::timeout(Duration::from_secs(3), client.events_until("turn_finished")).await;
    match mid {
        // The answer's commit failed but the small failure record fit: the
        // turn failed, saying why, and the answer never entered history.
        Ok(events) => {
            let end = events.unwrap().last().unwrap()["data"].clone();
            assert_eq!(end["status"], "failed");
            assert!(end["error"]["message"].as_str().unwrap().contains("full"), "{end}");
            std::fs::remove_file(&ballast).unwrap();
        }
        // Not even that fit: no new turn meanwhile; once space returns the
        // turn is recorded interrupted and resumes.
        Err(_) => {
            let busy = client
                .call("turn/start", json!({"session_id": id, "submission_id": "s-busy", "text": "x"}))
                .await
                .unwrap();
            assert!(busy.is_err(), "no new turn while the last one cannot be recorded");
            std::fs::remove_file(&ballast).unwrap();
            client.wait_for_status(&id, "interrupted").await.unwrap();
            mock.push(Reply::text("a shorter answer"));
            client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
            let events = client.events_until("turn_finished").await.unwrap();
            assert_eq!(events.last().unwrap()["data"]["status"], "completed");
        }
    }
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(
        !snapshot["history"].to_string().contains(&"y".repeat(1000)),
        "the answer that did not fit is not in history"
    );
    client
        .ok("turn/start", json!({"session_id": id, "submission_id": "s-last", "text": "still there?"}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let db = rusqlite::Connection::open(disk.inside("runtime.sqlite3")).unwrap();
    let integrity: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(integrity, "ok");
}

async fn provider_fault(replies: Vec<Reply>) -> (serde_json::Value, MockServer) {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    for reply in replies {
        mock.push(reply);
    }
    let env = [
        ("KEEL_PROVIDER_REQUEST_TIMEOUT_MS", "400"),
        ("KEEL_PROVIDER_IDLE_TIMEOUT_MS", "400"),
        ("KEEL_RETRY_BASE_MS", "5"),
    ];
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &support::example_bundle(), &env).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "hello"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    // Keel still serves after the fault.
    client.ok("session/get", json!({"session_id": id})).await.unwrap();
    (events.last().unwrap()["data"].clone(), mock)
}

#[tokio::test]
async fn a_provider_that_hangs_fails_the_turn_after_the_timeouts_and_retries() {
    let hang = || Reply::text("late").delay_first_byte(Duration::from_secs(30));
    let (end, mock) = provider_fault(vec![hang(), hang(), hang()]).await;
    assert_eq!(end["status"], "failed");
    assert!(end["error"]["message"].as_str().unwrap().contains("no response within"), "{end}");
    assert_eq!(mock.request_count(), 3, "tried three times");
}

#[tokio::test]
async fn a_provider_that_drips_slower_than_it_should_still_completes() {
    let words: Vec<String> = (0..20).map(|n| format!("w{n} ")).collect();
    let (end, _) =
        provider_fault(vec![Reply::text_deltas(words).delay_between_chunks(Duration::from_millis(150))]).await;
    assert_eq!(end["status"], "completed", "{end}");
}

#[tokio::test]
async fn a_provider_sending_garbage_fails_the_turn_clearly() {
    let garbage = || Reply::raw_stream(b"data: {not json\n\n\xff\xfe\x00garbage\n\n".to_vec());
    let (end, _) = provider_fault(vec![garbage(), garbage(), garbage()]).await;
    assert_eq!(end["status"], "failed");
    assert!(!end["error"]["message"].as_str().unwrap().is_empty(), "{end}");
}

#[tokio::test]
async fn a_provider_sending_a_huge_line_is_cut_off_not_buffered() {
    let huge = || Reply::raw_stream(format!("data: {}\n\n", "a".repeat(9 * 1024 * 1024)).into_bytes());
    let (end, _) = provider_fault(vec![huge(), huge(), huge()]).await;
    assert_eq!(end["status"], "failed");
    assert!(end["error"]["message"].as_str().unwrap().contains("line"), "{end}");
}

/// The runner process serving `keel`'s sessions, by scanning /proc.
fn runner_of(keel: u32) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(keel) && String::from_utf8_lossy(&cmdline).contains("__keel-runner") {
            return Some(pid);
        }
    }
    None
}

/// Whether a `sleep 30` runs somewhere below `ancestor`.
fn sleeping_under(ancestor: u32) -> bool {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
    };
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok()).any(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline != b"sleep\x0030\x00" {
            return false;
        }
        let mut at = pid;
        for _ in 0..8 {
            match parent(at) {
                Some(p) if p == ancestor => return true,
                Some(p) if p > 1 => at = p,
                _ => return false,
            }
        }
        false
    })
}

#[tokio::test]
async fn a_runner_killed_mid_call_fails_that_call_and_the_next_one_gets_a_new_runner() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command":"sleep 30"}"#));
    mock.push(Reply::tool_call("c2", "fs__write_file", r#"{"path":"after.txt","content":"ok"}"#));
    mock.push(Reply::text("done"));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let pid = keel.pid();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "wait"})).await.unwrap();
    let waiting = client.events_until("turn_waiting").await.unwrap();
    let question = waiting.last().unwrap()["data"]["interaction_id"].clone();
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question, "decision": "allow_once"}))
        .await
        .unwrap();
    client.events_until("tool_call_started").await.unwrap();
    // Kill the runner once the command itself runs.
    let mut runner = None;
    for _ in 0..500 {
        runner = runner_of(pid).filter(|&r| sleeping_under(r));
        if runner.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let runner = runner.expect("a runner serves the call");
    Command::new("kill").args(["-KILL", &runner.to_string()]).status().unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let calls = snapshot["tool_calls"].as_array().unwrap();
    let first = calls.iter().find(|c| c["call_id"] == "c1").unwrap();
    assert_eq!(first["is_error"], true);
    assert!(first["output"].as_str().unwrap().contains("runner stopped"), "{first}");
    let second = calls.iter().find(|c| c["call_id"] == "c2").unwrap();
    assert_eq!(second["is_error"], false, "a new runner served the next call: {second}");
    assert_eq!(std::fs::read_to_string(ws.join("after.txt")).unwrap(), "ok");
}

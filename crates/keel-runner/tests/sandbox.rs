//! The escapes a malicious model would try, each through a real runner
//! process, and each asserting how it fails. Positive controls show the same
//! operations succeed where the policy allows them, so a failure here is the
//! sandbox's doing, not a broken test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_runner::{RunnerCommand, RunnerError, RunnerPool, RunnerReply, SandboxPolicy};
use keel_tools::ShellLimits;
use serde_json::{Value, json};

struct Setup {
    dir: tempfile::TempDir,
    pool: RunnerPool,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["ws", "outside", "home/.ssh", "state", "shared-read", "shared-write"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("outside/secret.txt"), "TOP-SECRET").unwrap();
        std::fs::write(dir.path().join("home/.ssh/id_ed25519"), "PRIVATE-KEY").unwrap();
        std::fs::write(dir.path().join("state/token"), "KEEL-TOKEN").unwrap();
        std::fs::write(dir.path().join("shared-read/notes.txt"), "shared notes").unwrap();
        let pool = RunnerPool::new(runner(), Duration::from_secs(30));
        Setup { dir, pool }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    fn policy(&self) -> SandboxPolicy {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string());
        env.insert("HOME".to_string(), self.path("scratch").display().to_string());
        SandboxPolicy {
            workspace: self.path("ws"),
            read: vec![self.path("shared-read")],
            write: vec![self.path("shared-write")],
            network: false,
            env,
            scratch: self.path("scratch"),
            shell: ShellLimits { timeout_secs: 20, ..ShellLimits::default() },
        }
    }

    async fn call(&self, policy: &SandboxPolicy, tool: &str, arguments: Value) -> RunnerReply {
        self.pool.call("s1", policy, tool, arguments).await.unwrap()
    }

    async fn shell(&self, command: &str) -> Value {
        self.shell_with(&self.policy(), command).await
    }

    async fn shell_with(&self, policy: &SandboxPolicy, command: &str) -> Value {
        let reply = self.call(policy, "shell.run", json!({ "command": command })).await;
        assert!(reply.confinement.filesystem.starts_with("landlock-v"), "{:?}", reply.confinement);
        serde_json::from_str(&reply.text).unwrap()
    }
}

fn runner() -> RunnerCommand {
    RunnerCommand { program: env!("CARGO_BIN_EXE_keel-runner").into(), args: vec![keel_runner::RUNNER_ARG.into()] }
}

fn stderr(out: &Value) -> &str {
    out["stderr"].as_str().unwrap_or_default()
}

fn denied(out: &Value) {
    assert_ne!(out["exit_code"], 0, "{out}");
    let err = stderr(out);
    assert!(err.contains("Permission denied") || err.contains("Operation not permitted"), "{out}");
}

#[tokio::test]
async fn file_tools_refuse_paths_out_of_the_workspace() {
    let s = Setup::new();
    let p = s.policy();
    let secret = s.path("outside/secret.txt");
    std::os::unix::fs::symlink(&secret, s.path("ws/link")).unwrap();
    for path in ["../outside/secret.txt".to_string(), secret.display().to_string(), "link".to_string()] {
        let reply = s.call(&p, "fs.read_file", json!({ "path": path })).await;
        assert!(reply.is_error, "{path}: {}", reply.text);
        assert!(reply.text.contains("outside the workspace"), "{path}: {}", reply.text);
        assert!(!reply.text.contains("TOP-SECRET"));
    }
    let wrote = s.call(&p, "fs.write_file", json!({"path": "inside.txt", "content": "ok"})).await;
    assert!(!wrote.is_error, "{}", wrote.text);
    assert_eq!(std::fs::read_to_string(s.path("ws/inside.txt")).unwrap(), "ok");
}

#[tokio::test]
async fn commands_cannot_read_or_write_outside_what_the_policy_grants() {
    let s = Setup::new();
    let secret = s.path("outside/secret.txt");
    std::os::unix::fs::symlink(&secret, s.path("ws/link")).unwrap();
    std::os::unix::fs::symlink(s.path("outside"), s.path("ws/dirlink")).unwrap();
    // Reading: a symlink out, the file itself, ~/.ssh, keel's state and token.
    for target in [
        "link".to_string(),
        secret.display().to_string(),
        s.path("home/.ssh/id_ed25519").display().to_string(),
        s.path("state/token").display().to_string(),
        format!("/proc/self/root{}", secret.display()),
    ] {
        let out = s.shell(&format!("cat '{target}'")).await;
        denied(&out);
        assert!(!out.to_string().contains("TOP-SECRET") && !out.to_string().contains("KEEL-TOKEN"), "{out}");
    }
    let listing = s.shell(&format!("ls '{}'", s.path("state").display())).await;
    denied(&listing);
    // Writing: through /proc/self/root, through a directory symlink, to /etc.
    for target in [
        format!("/proc/self/root{}/pwned", s.path("outside").display()),
        "dirlink/pwned".to_string(),
        "/etc/keel-pwned".to_string(),
    ] {
        let out = s.shell(&format!("echo pwned > '{target}'")).await;
        assert_ne!(out["exit_code"], 0, "{out}");
    }
    assert!(!s.path("outside/pwned").exists());
    assert!(!Path::new("/etc/keel-pwned").exists());
    // The same operations succeed where the policy allows them.
    let ok = s.shell("echo fine > here.txt && cat here.txt && head -c 4 /etc/os-release").await;
    assert_eq!(ok["exit_code"], 0, "{ok}");
    assert!(ok["stdout"].as_str().unwrap().starts_with("fine\n"), "{ok}");
    let read = s.shell(&format!("cat '{}'", s.path("shared-read/notes.txt").display())).await;
    assert_eq!(read["stdout"], "shared notes", "{read}");
    let write_ro = s.shell(&format!("echo x > '{}'", s.path("shared-read/new.txt").display())).await;
    denied(&write_ro);
    let write_rw = s.shell(&format!("echo x > '{}/new.txt'", s.path("shared-write").display())).await;
    assert_eq!(write_rw["exit_code"], 0, "{write_rw}");
}

#[tokio::test]
async fn the_network_is_off_unless_the_policy_allows_it() {
    let s = Setup::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let curl = format!("curl -sS --max-time 5 http://127.0.0.1:{port}/");
    let out = s.shell(&curl).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    assert!(stderr(&out).contains("Failed to connect") || stderr(&out).contains("Couldn't connect"), "{out}");
    assert!(listener.accept().is_err(), "nothing reached the host's loopback");
    // Positive control: with the network allowed the same request arrives.
    let mut open = s.policy();
    open.network = true;
    let reply = s.call(&open, "shell.run", json!({ "command": curl })).await;
    assert_eq!(reply.confinement.network, "allowed");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if listener.accept().is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the allowed request never arrived: {}", reply.text);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn commands_see_only_the_policy_environment_and_not_keels() {
    let s = Setup::new();
    // `cargo test` runs this process with CARGO_* variables: none may leak.
    assert!(std::env::vars().any(|(k, _)| k.starts_with("CARGO")));
    let out = s.shell("env").await;
    let vars: Vec<&str> = out["stdout"].as_str().unwrap().lines().filter_map(|l| l.split('=').next()).collect();
    assert!(!vars.iter().any(|k| k.starts_with("CARGO")), "{vars:?}");
    assert!(vars.contains(&"PATH") && vars.contains(&"HOME"), "{vars:?}");
    // Nor through /proc: keel's own environment is out of reach.
    let out = s.shell(&format!("cat /proc/{}/environ", std::process::id())).await;
    assert!(!out["stdout"].as_str().unwrap().contains("CARGO"), "{out}");
    assert_ne!(out["exit_code"], 0, "{out}");
}

/// Whether this test process runs as root (from /proc, no FFI).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
}

/// Processes whose command line holds `marker`, after giving the kernel up
/// to 5 s to finish killing a tree.
fn leftovers(marker: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = count(marker);
        if n == 0 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn count(marker: &str) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            n += 1;
        }
    }
    n
}

/// The unprivileged user a root test hands its runner to.
const NOBODY: u32 = 65534;

impl Setup {
    /// A setup whose runner does not run as the host's root, so that
    /// `RLIMIT_NPROC` binds it: when this test runs as root the runner is
    /// started as `nobody` (through util-linux's `setpriv`), and the test's
    /// folders are handed to that user.
    fn unprivileged() -> Setup {
        let mut s = Setup::new();
        if !running_as_root() {
            return s;
        }
        std::fs::create_dir_all(s.path("scratch")).unwrap();
        let mut exe = PathBuf::from(env!("CARGO_BIN_EXE_keel-runner"));
        if !others_can_run(&exe) {
            let copy = s.path("bin/keel-runner");
            std::fs::create_dir_all(s.path("bin")).unwrap();
            std::fs::copy(&exe, &copy).unwrap();
            exe = copy;
        }
        chown_tree(s.dir.path());
        let program = PathBuf::from("/usr/bin/setpriv");
        assert!(program.exists(), "testing as an unprivileged user needs setpriv (util-linux)");
        let args = ["--reuid=65534", "--regid=65534", "--clear-groups"].map(String::from);
        let mut args = args.to_vec();
        args.extend([exe.display().to_string(), keel_runner::RUNNER_ARG.into()]);
        s.pool = RunnerPool::new(RunnerCommand { program, args }, Duration::from_secs(30));
        s
    }
}

fn chown_tree(path: &Path) {
    std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    if std::fs::symlink_metadata(path).unwrap().is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path());
        }
    }
}

/// Whether any user may execute `exe` (every folder above it searchable).
fn others_can_run(exe: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode()).unwrap_or(0);
    mode(exe) & 0o005 == 0o005 && exe.ancestors().skip(1).all(|dir| mode(dir) & 0o001 != 0)
}

/// What a runner's confinement report says caps its commands' processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caps {
    /// `pid_max:<n>`: at most n processes per command.
    per_command: Option<u64>,
    /// `rlimit:<n>`: at most n processes and threads for the runner and its
    /// commands together.
    per_runner: Option<u64>,
}

impl Caps {
    fn from_report(report: &str) -> Caps {
        let mut parts = report.split('+');
        assert_eq!(parts.next(), Some("pid-namespace"), "{report}");
        let mut caps = Caps { per_command: None, per_runner: None };
        let mut uncapped = false;
        for part in parts {
            match part.split_once(':') {
                Some(("pid_max", n)) => caps.per_command = Some(n.parse().unwrap()),
                Some(("rlimit", n)) => caps.per_runner = Some(n.parse().unwrap()),
                _ if part == "uncapped" => uncapped = true,
                _ => panic!("unknown part {part:?} of {report:?}"),
            }
        }
        assert_eq!(uncapped, !caps.any(), "{report}");
        caps
    }

    fn any(&self) -> bool {
        self.per_command.is_some() || self.per_runner.is_some()
    }
}

/// Whether the kernel refused a fork (dash: "Cannot fork"; bash: "fork:
/// Resource temporarily unavailable"), not merely the word "fork" in an
/// echo of the command.
fn refused_a_fork(out: &Value) -> bool {
    let err = stderr(out).to_lowercase();
    err.contains("cannot fork") || err.contains("resource temporarily unavailable")
}

/// A bounded probe: starts up to `n` sleepers one at a time, printing how
/// many have started after each; the first refused fork ends the shell
/// (exit code 2). However the cap behaves, it holds at most `n` + 1
/// processes, all dead once the shell ends. The sleep's length, `60.<tag>`,
/// marks the sleepers in /proc.
fn sleepers(n: u64, tag: &str) -> String {
    format!("i=0; while [ $i -lt {n} ]; do sleep 60.{tag} & i=$((i+1)); echo $i; done; echo all started")
}

/// How many sleepers [`sleepers`] started.
fn started(out: &Value) -> u64 {
    let stdout = out["stdout"].as_str().unwrap_or_default();
    stdout.lines().filter_map(|l| l.parse().ok()).next_back().unwrap_or(0)
}

/// Runs [`sleepers`] (`n` more than any reported cap) and asserts the
/// report is true: a command got at most the processes the report allows,
/// exactly as many where `pid_max` alone caps it, and all `n` where the
/// report says nothing caps it.
async fn assert_report_is_true(s: &Setup, policy: &SandboxPolicy, caps: Caps, tag: &str) {
    let n = caps.per_command.max(caps.per_runner).unwrap_or(policy.shell.max_processes) + 20;
    let out = s.shell_with(policy, &sleepers(n, tag)).await;
    let got = started(&out);
    if !caps.any() {
        // Uncapped means uncapped: nothing refused any of the n forks.
        assert_eq!(got, n, "{caps:?}: {out}");
        assert!(out["stdout"].as_str().unwrap().ends_with("all started\n") && out["exit_code"] == 0, "{out}");
    } else {
        assert!(got > 0 && refused_a_fork(&out), "some sleepers started, then a fork was refused: {out}");
    }
    // The shell is one process; the sleepers are the rest.
    if let Some(cap) = caps.per_command {
        assert!(got < cap, "{caps:?}: {got} sleepers and the shell");
        if caps.per_runner.is_none() {
            assert_eq!(got + 1, cap, "{caps:?}: the cap is the one reported, not another");
        }
    }
    // RLIMIT_NPROC also counts the init helper and the runner's threads.
    if let Some(cap) = caps.per_runner {
        assert!(got + 2 < cap, "{caps:?}: {got} sleepers, the shell and its init");
    }
    assert_eq!(leftovers(&format!("60.{tag}")), 0, "every sleeper died with the shell");
}

/// Runs a fork bomb twice (ending each way a capped bomb can end) and
/// asserts what holds either way: forks were refused at the cap, the call
/// returned well within a bound, nothing of the bomb is left, and the same
/// runner serves the next command. A bounded probe goes first: the bomb
/// runs only under a cap seen to hold, never on a report's word alone.
/// `60.<tag>`, a sleep length, marks every process of the bomb in /proc:
/// the shells' command lines hold it, as do the sleeps'.
async fn assert_bomb_contained(s: &Setup, policy: &SandboxPolicy, tag: &str) {
    let reply = s.call(policy, "shell.run", json!({"command": "readlink /proc/self/ns/user"})).await;
    let caps = Caps::from_report(&reply.confinement.processes);
    assert!(caps.any(), "never run a bomb uncapped: {:?}", reply.confinement);
    assert_report_is_true(s, policy, caps, tag).await;
    // The runner's user namespace: another runner would have another one.
    let runner: Value = serde_json::from_str(&reply.text).unwrap();
    assert!(runner["stdout"].as_str().unwrap().starts_with("user:["), "{runner}");
    let mark = format!("60.{tag}");
    for (ending, command) in [
        // Usually stopped by the timeout or the output cap, but the shell
        // exits ("Cannot fork", code 2) if the bomb fills the cap before
        // the shell forks its sleep.
        ("then sleeps", format!("bomb() {{ bomb | bomb & }}; bomb; sleep {mark}")),
        // The shell fills the cap itself, so it gives up well before the
        // timeout: the ending the earlier assertion could not take.
        ("then keeps forking", format!("bomb() {{ bomb | bomb & }}; bomb; while :; do sleep {mark} & done")),
    ] {
        let started = Instant::now();
        let out = s.shell_with(policy, &command).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "{ending}: took {took:?}");
        assert!(refused_a_fork(&out), "{ending}: forks were refused at the cap: {out}");
        let stopped = out["note"].as_str().unwrap_or_default().contains("was stopped");
        assert!(stopped || out["exit_code"] != 0, "{ending}: stopped, or the shell gave up: {out}");
        assert_eq!(leftovers(&mark), 0, "{ending}: no process of the bomb is left");
        let next = s.shell_with(policy, "readlink /proc/self/ns/user").await;
        assert_eq!(next, runner, "{ending}: the same runner serves the next command");
    }
}

#[tokio::test]
async fn a_fork_bomb_is_contained_and_its_whole_tree_killed() {
    let native = Setup::new();
    let mut policy = native.policy();
    policy.shell.timeout_secs = 3;
    policy.shell.max_processes = 64;
    let reply = native.call(&policy, "shell.run", json!({"command": "true"})).await;
    let s = if Caps::from_report(&reply.confinement.processes).any() {
        native
    } else {
        // Root before Linux 6.14: nothing caps this runner, and a bomb would
        // starve the machine (`commands_get_no_more_processes_than_the_runner_reports`
        // checks that the report is true). The bomb runs where RLIMIT_NPROC
        // binds instead.
        Setup::unprivileged()
    };
    let mut policy = s.policy();
    policy.shell.timeout_secs = 3;
    policy.shell.max_processes = 64;
    assert_bomb_contained(&s, &policy, "0713").await;
}

#[tokio::test]
async fn commands_get_no_more_processes_than_the_runner_reports() {
    let s = Setup::new();
    let mut policy = s.policy();
    policy.shell.max_processes = 64;
    let reply = s.call(&policy, "shell.run", json!({"command": "true"})).await;
    let caps = Caps::from_report(&reply.confinement.processes);
    assert_report_is_true(&s, &policy, caps, "2281").await;
}

#[tokio::test]
async fn the_nproc_fallback_is_reported_truthfully_and_caps_an_unprivileged_runner() {
    // The fallback of kernels before 6.14, forced: RLIMIT_NPROC only.
    let in_host_user_ns = std::fs::read_link("/proc/self/ns/user").unwrap().to_string_lossy() == "user:[4026531837]";
    for (who, s) in [("this user", Setup::new()), ("an unprivileged user", Setup::unprivileged())] {
        let mut policy = s.policy();
        policy.env.insert(keel_runner::sandbox::FORCE_NPROC_FALLBACK.into(), "1".into());
        policy.shell.timeout_secs = 3;
        policy.shell.max_processes = 16;
        let reply = s.call(&policy, "shell.run", json!({"command": "true"})).await;
        let report = reply.confinement.processes;
        let caps = Caps::from_report(&report);
        assert_eq!(caps.per_command, None, "{who}: the knob leaves pid_max alone: {report}");
        // Where the runner can tell (the host's user namespace): the kernel
        // exempts root from RLIMIT_NPROC, and no one else.
        if in_host_user_ns {
            let root = running_as_root() && who == "this user";
            let expected = if root { "pid-namespace+uncapped" } else { "pid-namespace+rlimit:16" };
            assert_eq!(report, expected, "{who}");
        }
        // A bounded probe checks the report either way; only a cap it saw
        // hold is trusted with a real bomb.
        let tag = if who == "this user" { "3301" } else { "3302" };
        if caps.any() {
            assert_bomb_contained(&s, &policy, tag).await;
        } else {
            assert_report_is_true(&s, &policy, caps, tag).await;
        }
    }
}

#[tokio::test]
async fn endless_output_is_cut_and_a_timeout_kills_background_children() {
    let s = Setup::new();
    let started = Instant::now();
    let out = s.shell("yes keel-endless-output").await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out["output_truncated"], true, "{}", out["note"]);
    assert!(out["note"].as_str().unwrap().contains("more than 65536 bytes"));
    assert!(out["stdout"].as_str().unwrap().len() <= 65536);

    let out = s
        .call(
            &s.policy(),
            "shell.run",
            json!({"command": "sleep 120 & sleep 121 # sleeper-marker-91c2", "timeout_secs": 1}),
        )
        .await;
    assert!(out.is_error);
    assert!(out.text.contains("stopped after 1 s"), "{}", out.text);
    assert_eq!(leftovers("sleeper-marker-91c2"), 0, "the background sleep died with the command");
    // The runner survives and serves the next call.
    let next = s.shell("echo still here").await;
    assert_eq!(next["stdout"], "still here\n");
}

#[tokio::test]
async fn a_sandbox_that_cannot_be_set_up_fails_the_call_instead_of_running_it() {
    let s = Setup::new();
    // A user namespace where creating further user namespaces is refused by
    // the kernel (the limit is per namespace). The runner runs in a
    // background subshell that outlives the pool's kill of the shell, and
    // its stderr goes to a file, so that all it says there is seen.
    let runner_stderr = s.path("runner-stderr");
    let runner_done = s.path("runner-done");
    let refusing = RunnerCommand {
        program: "/usr/bin/unshare".into(),
        args: vec![
            "--user".into(),
            "--map-root-user".into(),
            "/bin/sh".into(),
            "-c".into(),
            "echo 0 > /proc/sys/user/max_user_namespaces || exit 1; exec 3<&0; \
             (\"$0\" __keel-runner <&3 3<&- 2>\"$1\"; touch \"$2\") &"
                .into(),
            env!("CARGO_BIN_EXE_keel-runner").into(),
            runner_stderr.display().to_string(),
            runner_done.display().to_string(),
        ],
    };
    let pool = RunnerPool::new(refusing, Duration::from_secs(5));
    let marker = s.path("ws/ran");
    let command = format!("touch '{}'", marker.display());
    let error = pool.call("s1", &s.policy(), "shell.run", json!({ "command": command })).await.unwrap_err();
    assert!(matches!(error, RunnerError::Confinement(_)), "{error}");
    assert!(error.to_string().contains("user namespace"), "{error}");
    assert!(!marker.exists(), "nothing ran");
    // The reason reached keel, with the call; the runner did not also print
    // it, unexplained, to the stderr it shares with keel.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !runner_done.exists() {
        assert!(Instant::now() < deadline, "the runner never exited ({error})");
        std::thread::sleep(Duration::from_millis(20));
    }
    let printed = std::fs::read_to_string(&runner_stderr).unwrap();
    assert_eq!(printed, "", "the runner's stderr, besides the error keel got: {error}");
}

#[tokio::test]
async fn a_runner_is_reused_per_session_and_replaced_when_the_policy_changes() {
    let s = Setup::new();
    let p = s.policy();
    let first = s.shell("echo $$").await;
    let again = s.shell("echo $$").await;
    // Both commands are init (pid 1) of their own PID namespace.
    assert_eq!(first["stdout"], "1\n");
    assert_eq!(again["stdout"], "1\n");
    let runner_pid = |_: &Value| s.pool.idle_runners();
    assert_eq!(runner_pid(&first), 1);
    let mut open = p.clone();
    open.network = true;
    let reply = s.call(&open, "shell.run", json!({"command": "true"})).await;
    assert_eq!(reply.confinement.network, "allowed");
    assert_eq!(s.pool.idle_runners(), 1, "the old runner was replaced, not kept");
}
